// The glue around the vendor BLAS's matrix products of a batched step at 32 or more streams
// (backends/kernels/gemm.py: cuBLAS or hipBLASLt through torch, bf16 inputs on tensor cores): the
// step's float32 rows made bf16 GEMM inputs, RMS-normalised on the way where the GEMV would have
// fused the norm, and the SwiGLU of a gate/up product. Each is one block a row; the rows are a few
// KB, so these kernels cost their launch, not their bytes.
#include "common.cuh"

namespace {
constexpr int kThreads = 256;

// Row blockIdx.x of x [rows, n] into the same row of y as bf16: w * (x * rsqrt(mean(x^2) + eps)) in
// float32 (the GEMVs' fused norm, norm.cu's order) when NORM, else x itself.
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

// Row blockIdx.x of gate_up [rows, 2 n] (gate and up interleaved, weights.py) into y [rows, n] as float32
// and as bf16 (the down projection's input): silu(g) * u, in float32 as the GEMVs' SwiGLU mode does it.
__global__ void __launch_bounds__(kThreads) k_swiglu(const float* __restrict__ gate_up, float* __restrict__ y,
                                                     uint16_t* __restrict__ y_bf16, int n) {
    q3t_grid_dep_trigger_first();
    const float2* gu = reinterpret_cast<const float2*>(gate_up + (size_t)blockIdx.x * 2 * n);
    y += (size_t)blockIdx.x * n;
    y_bf16 += (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float2 v = gu[i];
        const float s = (v.x / (1.0f + expf(-v.x))) * v.y;
        y[i] = s;
        y_bf16[i] = f32_to_bf16(s);
    }
}
}  // namespace

extern "C" Q3T_API int q3t_batched_rows_bf16(const float* x, const float* w, float eps, void* y, int n, int rows,
                                             void* stream) {
    if (!x || !y || n <= 0 || rows < 1 || rows > 2 * Q3T_BATCH_MAX)
        return q3t_fail("q3t_batched_rows_bf16: bad arguments (n=%d rows=%d)", n, rows);
    uint16_t* out = static_cast<uint16_t*>(y);
    if (w)
        q3t_launch(k_rows_bf16<true>, rows, kThreads, 0, Q3T_STREAM(stream), x, w, out, n, eps);
    else
        q3t_launch(k_rows_bf16<false>, rows, kThreads, 0, Q3T_STREAM(stream), x, w, out, n, eps);
    return q3t_check_launch("q3t_batched_rows_bf16");
}

extern "C" Q3T_API int q3t_batched_swiglu(const float* gate_up, float* y, void* y_bf16, int n, int rows,
                                          void* stream) {
    if (!gate_up || !y || !y_bf16 || n <= 0 || rows < 1 || rows > 2 * Q3T_BATCH_MAX)
        return q3t_fail("q3t_batched_swiglu: bad arguments (n=%d rows=%d)", n, rows);
    q3t_launch(k_swiglu, rows, kThreads, 0, Q3T_STREAM(stream), gate_up, y, static_cast<uint16_t*>(y_bf16), n);
    return q3t_check_launch("q3t_batched_swiglu");
}
