// Standalone RMSNorm (the final norm whose output feeds both codec_head and the CodePredictor), of one
// row or of each row of a batched step. Most norms are fused into the GEMV that follows them (gemv.cu).
#include "common.cuh"

namespace {
constexpr int kThreads = 256;

// Row blockIdx.x of x [rows, n] into the same row of y.
__global__ void __launch_bounds__(kThreads) k_rmsnorm(const float* __restrict__ x, const float* __restrict__ w,
                                                      float* __restrict__ y, int n, float eps) {
    q3t_grid_dep_trigger_first();
    __shared__ float red[32];
    x += (size_t)blockIdx.x * n;
    y += (size_t)blockIdx.x * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
    const float r = rsqrtf(block_sum(ss, red) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = w[i] * (x[i] * r);
}
}  // namespace

extern "C" Q3T_API int q3t_rmsnorm(const float* x, const float* w, float* y, int n, float eps, void* stream) {
    if (!x || !w || !y || n <= 0) return q3t_fail("q3t_rmsnorm: bad arguments (n=%d)", n);
    q3t_launch(k_rmsnorm, 1, kThreads, 0, Q3T_STREAM(stream), x, w, y, n, eps);
    return q3t_check_launch("q3t_rmsnorm");
}

extern "C" Q3T_API int q3t_batched_rmsnorm(const float* x, const float* w, float* y, int n, int nb, float eps,
                                           void* stream) {
    if (!x || !w || !y || n <= 0 || nb < 1 || nb > Q3T_BATCH_MAX)
        return q3t_fail("q3t_batched_rmsnorm: bad arguments (n=%d nb=%d)", n, nb);
    q3t_launch(k_rmsnorm, nb, kThreads, 0, Q3T_STREAM(stream), x, w, y, n, eps);
    return q3t_check_launch("q3t_batched_rmsnorm");
}
