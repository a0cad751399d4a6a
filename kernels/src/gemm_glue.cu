// The glue around the vendor BLAS's matrix products of a batched step at 32 or more streams
// (backends/kernels/gemm.py: cuBLAS or hipBLASLt through torch, bf16 inputs on tensor cores): the
// step's float32 rows made bf16 GEMM inputs, RMS-normalised on the way where the GEMV would have
// fused the norm, and the SwiGLU of a gate/up product. The rows are a few KB: these kernels cost
// their launch and their dependent round trips, not their bytes, so each reads its input once, wide.
#include "common.cuh"

namespace {
constexpr int kThreads = 256;
constexpr int kHeld = 8;  // float4s of a row each thread holds in registers: rows up to 8,192 floats (kRowsVec4Max)
constexpr int kRowsVec4Max = kHeld * 4 * kThreads;

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    return (uint32_t)f32_to_bf16(lo) | ((uint32_t)f32_to_bf16(hi) << 16);
}

// Row blockIdx.x of x [rows, n] into the same row of y as bf16: w * (x * rsqrt(mean(x^2) + eps)) in
// float32 (the GEMVs' fused norm, norm.cu's order) when NORM, else x itself. Rows of a multiple of 4 floats up
// to kRowsVec4Max: each thread reads its float4s once into registers (one round trip for the row, the norm's
// sum from them), and writes 4 bf16 at a time; they are a few KB, so the launch is the cost, not the bytes.
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
            y[i] = make_uint2(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w));
        }
    }
}

// The same for any row length (not a multiple of 4, or longer than kRowsVec4Max), one float at a time.
template <bool NORM>
__global__ void __launch_bounds__(kThreads) k_rows_bf16(const float* __restrict__ x, const float* __restrict__ w,
                                                        uint16_t* __restrict__ y, int n, float eps) {
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
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = f32_to_bf16(NORM ? w[i] * (x[i] * r) : x[i]);
}

// gate_up [rows, 2 n] (gate and up interleaved, weights.py) into y [rows, n] as float32 and as bf16 (the down
// projection's input): silu(g) * u, in float32 as the GEMVs' SwiGLU mode does it. Block (x, row) takes outputs
// [2 kThreads x, 2 kThreads (x + 1)) of its row, two a thread from one float4 (g0, u0, g1, u1): many blocks,
// so the 64 rows of a step spread over the GPU instead of queueing on 64 SMs.
__global__ void __launch_bounds__(kThreads) k_swiglu_pairs(const float4* __restrict__ gate_up, float2* __restrict__ y,
                                                           uint32_t* __restrict__ y_bf16, int n2) {
    q3t_grid_dep_trigger_first();
    const int i = blockIdx.x * kThreads + threadIdx.x;
    if (i >= n2) return;
    const size_t at = (size_t)blockIdx.y * n2 + i;
    const float4 v = gate_up[at];
    const float a = (v.x / (1.0f + expf(-v.x))) * v.y;
    const float b = (v.z / (1.0f + expf(-v.z))) * v.w;
    y[at] = make_float2(a, b);
    y_bf16[at] = pack_bf16x2(a, b);
}

// The same for an odd n, one output at a time (block x of row y).
__global__ void __launch_bounds__(kThreads) k_swiglu(const float2* __restrict__ gate_up, float* __restrict__ y,
                                                     uint16_t* __restrict__ y_bf16, int n) {
    q3t_grid_dep_trigger_first();
    const int i = blockIdx.x * kThreads + threadIdx.x;
    if (i >= n) return;
    const size_t at = (size_t)blockIdx.y * n + i;
    const float2 v = gate_up[at];
    const float s = (v.x / (1.0f + expf(-v.x))) * v.y;
    y[at] = s;
    y_bf16[at] = f32_to_bf16(s);
}
}  // namespace

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
            q3t_launch(k_rows_bf16<true>, rows, kThreads, 0, s, x, w, out, n, eps);
        else
            q3t_launch(k_rows_bf16<false>, rows, kThreads, 0, s, x, w, out, n, eps);
    }
    return q3t_check_launch("q3t_batched_rows_bf16");
}

extern "C" Q3T_API int q3t_batched_swiglu(const float* gate_up, float* y, void* y_bf16, int n, int rows,
                                          void* stream) {
    if (!gate_up || !y || !y_bf16 || n <= 0 || rows < 1 || rows > 2 * Q3T_BATCH_MAX)
        return q3t_fail("q3t_batched_swiglu: bad arguments (n=%d rows=%d)", n, rows);
    cudaStream_t s = Q3T_STREAM(stream);
    const bool pairs = n % 2 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(y) % 8 == 0 && reinterpret_cast<uintptr_t>(y_bf16) % 4 == 0;
    if (pairs) {
        const int n2 = n / 2;
        q3t_launch(k_swiglu_pairs, dim3((n2 + kThreads - 1) / kThreads, rows), kThreads, 0, s,
                   reinterpret_cast<const float4*>(gate_up), reinterpret_cast<float2*>(y), static_cast<uint32_t*>(y_bf16), n2);
    } else {
        q3t_launch(k_swiglu, dim3((n + kThreads - 1) / kThreads, rows), kThreads, 0, s,
                   reinterpret_cast<const float2*>(gate_up), y, static_cast<uint16_t*>(y_bf16), n);
    }
    return q3t_check_launch("q3t_batched_swiglu");
}
