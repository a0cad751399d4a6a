// Row-wise RMSNorm, one block a row: in float32 for the standalone norm (the final norm whose output feeds
// both codec_head and the CodePredictor; most norms are fused into the GEMV that follows them, gemv.cu), and
// into bf16 for the vendor BLAS's inputs of a batched step at 32 or more streams (backends/kernels/gemm.py:
// the float32 rows RMS-normalised where the GEMV would have fused the norm, or only made bf16).
#include "common.cuh"

namespace {
constexpr int kThreads = 256;
constexpr int kHeld = 8;  // float4s of a row each thread holds in registers: rows up to 8,192 floats (kRowsVec4Max)
constexpr int kRowsVec4Max = kHeld * 4 * kThreads;

// Row blockIdx.x of x [rows, n] into the same row of y (float32 or bf16): w * (x * rsqrt(mean(x^2) + eps)) in
// float32 when NORM, else x itself.
template <typename Out, bool NORM>
__global__ void __launch_bounds__(kThreads) k_rms_rows(const float* __restrict__ x, const float* __restrict__ w,
                                                       Out* __restrict__ y, int n, float eps) {
    q3t_grid_dep_trigger_first();
    x += (size_t)blockIdx.x * n;
    y += (size_t)blockIdx.x * n;
    float r = 1.f;
    if (NORM) {
        __shared__ float red[32];
        float ss = 0.f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
        r = rsqrtf(block_sum(ss, red) / (float)n + eps);
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) Elem<Out>::store(y, i, NORM ? w[i] * (x[i] * r) : x[i]);
}

// k_rms_rows into bf16 for rows of a multiple of 4 floats up to kRowsVec4Max: each thread reads its float4s once
// into registers (one round trip for the row, the norm's sum from them) and writes 4 bf16 at a time. The rows
// are a few KB: the launch and its dependent round trips are the cost, not the bytes. The same arithmetic.
template <bool NORM>
__global__ void __launch_bounds__(kThreads) k_rows_bf16_vec4(const float4* __restrict__ x, const float4* __restrict__ w,
                                                             uint2* __restrict__ y, int n4, float eps) {
    q3t_grid_dep_trigger_first();
    x += (size_t)blockIdx.x * n4;
    y += (size_t)blockIdx.x * n4;
    float4 v[kHeld];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
        const int i = threadIdx.x + j * kThreads;
        if (i < n4) {
            v[j] = x[i];
            ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
        }
    }
    float r = 1.f;
    if (NORM) {
        __shared__ float red[32];
        r = rsqrtf(block_sum(ss, red) / (float)(4 * n4) + eps);
    }
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
        const int i = threadIdx.x + j * kThreads;
        if (i < n4) {
            float4 a = v[j];
            if (NORM) {
                const float4 g = w[i];
                a = make_float4(g.x * (a.x * r), g.y * (a.y * r), g.z * (a.z * r), g.w * (a.w * r));
            }
            y[i] = make_uint2(f32x2_to_bf16x2(a.x, a.y), f32x2_to_bf16x2(a.z, a.w));
        }
    }
}
}  // namespace

extern "C" Q3T_API int q3t_rmsnorm(const float* x, const float* w, float* y, int n, float eps, void* stream) {
    if (!x || !w || !y || n <= 0) return q3t_fail("q3t_rmsnorm: bad arguments (n=%d)", n);
    q3t_launch(k_rms_rows<float, true>, 1, kThreads, 0, Q3T_STREAM(stream), x, w, y, n, eps);
    return q3t_check_launch("q3t_rmsnorm");
}

extern "C" Q3T_API int q3t_batched_rmsnorm(const float* x, const float* w, float* y, int n, int nb, float eps,
                                           void* stream) {
    if (!x || !w || !y || n <= 0 || nb < 1 || nb > Q3T_BATCH_MAX)
        return q3t_fail("q3t_batched_rmsnorm: bad arguments (n=%d nb=%d)", n, nb);
    q3t_launch(k_rms_rows<float, true>, nb, kThreads, 0, Q3T_STREAM(stream), x, w, y, n, eps);
    return q3t_check_launch("q3t_batched_rmsnorm");
}

extern "C" Q3T_API int q3t_batched_rows_bf16(const float* x, const float* w, float eps, void* y, int n, int rows,
                                             void* stream) {
    if (!x || !y || n <= 0 || rows < 1 || rows > 2 * Q3T_BATCH_MAX)
        return q3t_fail("q3t_batched_rows_bf16: bad arguments (n=%d rows=%d)", n, rows);
    const bool vec4 = n % 4 == 0 && n <= kRowsVec4Max && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 8 == 0;
    cudaStream_t s = Q3T_STREAM(stream);
    if (vec4) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const float4* w4 = reinterpret_cast<const float4*>(w);
        uint2* y4 = static_cast<uint2*>(y);
        if (w)
            q3t_launch(k_rows_bf16_vec4<true>, rows, kThreads, 0, s, x4, w4, y4, n / 4, eps);
        else
            q3t_launch(k_rows_bf16_vec4<false>, rows, kThreads, 0, s, x4, w4, y4, n / 4, eps);
    } else {
        uint16_t* out = static_cast<uint16_t*>(y);
        if (w)
            q3t_launch(k_rms_rows<uint16_t, true>, rows, kThreads, 0, s, x, w, out, n, eps);
        else
            q3t_launch(k_rms_rows<uint16_t, false>, rows, kThreads, 0, s, x, w, out, n, eps);
    }
    return q3t_check_launch("q3t_batched_rows_bf16");
}
