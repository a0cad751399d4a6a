// Matrix-vector products for batch-1 decode, optionally fused with the RMSNorm that precedes
// them, a bias, a residual add or the SwiGLU gate: the q3t_gemv / q3t_gemv_batch entry points and
// the kernel for long rows.
//
// q3t_gemv takes the split-K kernel (gemv_splitk.cu) for K <= 4096 and the warp-per-row kernel
// below for longer rows: on the H200 the split-K kernel is 10-32 % faster on every K <= 3072 shape
// of the decode loop and slower on the one longer one, the 1.7B Talker's down_proj (K = 6144:
// 15.9 vs 12.8 us; docs/performance.md, "Decisions").
//
// The row kernel: one warp per output (two weight rows for SwiGLU), 256-thread blocks. The input
// vector is normalised once per block into shared memory; each lane then streams its share of
// the weight row in 16-byte loads (16 int8, 8 bf16 or 4 f32), the first eight issued before the
// kernel even waits for its input (see k_gemv), then four at a time. Accumulation is float32 in a
// fixed order, so results are run-to-run identical. int8 rows (Q3T_I8) are widened in registers and
// their row scale multiplies the finished sum.
#include "common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

template <typename W> using Vec = WeightVec16<W>;

template <typename W, int MODE, bool VEC>
__global__ void __launch_bounds__(kThreads) k_gemv(const W* __restrict__ w, const float* __restrict__ w_scale,
                                                   int n_out, int k, const float* __restrict__ x,
                                                   const float* __restrict__ norm_w, float eps,
                                                   const float* __restrict__ bias, float* __restrict__ y) {
    constexpr int NR = MODE == Q3T_GEMV_SWIGLU ? 2 : 1;  // weight rows per output
    constexpr int kPre = 8 / NR;                         // 16-byte loads per lane and row issued up front
    constexpr int V = Vec<W>::N;
    extern __shared__ float xs[];  // xs_len(k) floats (16-byte aligned: dynamic shared memory starts aligned)
    __shared__ float red[32];
    const int lane = threadIdx.x % Q3T_WARP;
    const int out = blockIdx.x * (blockDim.x / Q3T_WARP) + threadIdx.x / Q3T_WARP;
    const bool active = out < n_out;
    const int nvec = VEC ? k / V : 0;
    const W* rows[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) rows[r] = w + (size_t)(NR * (active ? out : 0) + r) * k;

    // Weights never change, so the first loads of each row go out before waiting for the
    // previous kernel (programmatic dependent launch) and overlap its tail and the x/norm
    // prologue below; for k <= 2048 (bf16) that is the whole row.
    uint4 pre[NR][kPre];
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int j = 0; j < kPre; ++j) {
            const int c = lane + j * Q3T_WARP;
            pre[r][j] = (VEC && active && c < nvec) ? reinterpret_cast<const uint4*>(rows[r])[c] : make_uint4(0, 0, 0, 0);
        }

    // The row scales (int8) are weights too: lane 0 loads them with the rows.
    float ws[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) ws[r] = row_scaled<W>() && active && lane == 0 ? w_scale[NR * out + r] : 1.f;

    float y_old = 0.f;
    // Behind a branch on an argument that always holds, so ptxas keeps the loads above the wait
    // (as in gemv_splitk.cu; tests/test_native_build.py checks the SASS).
    if (k > 0) {
        q3t_grid_dep();
        // Residual add: the warp's residual value goes out with x's loads below (one round trip).
        if (MODE == Q3T_GEMV_ADD && active && lane == 0) y_old = y[out];
    }
    constexpr bool PAD = VEC && xs_padded<W>();  // xs padded for the dot products (common.cuh)
    const float ss = stage_x(x, nullptr, k, xs, PAD);
    if (norm_w) {
        // RMSNorm as the reference: statistics in float32, x * rsqrt(mean(x^2) + eps), then * weight.
        const float total = block_sum(ss, red);
        const float rs = rsqrtf(total / (float)k + eps);
        for (int i = threadIdx.x; i < k; i += blockDim.x) xs[xs_at(i, PAD)] = norm_w[i] * (xs[xs_at(i, PAD)] * rs);
    }
    __syncthreads();
    if (!active) return;

    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = 0.f;
    if (VEC) {
#pragma unroll
        for (int j = 0; j < kPre; ++j) {
            const int c = lane + j * Q3T_WARP;
            if (c < nvec) {
#pragma unroll
                for (int r = 0; r < NR; ++r) acc[r] += Vec<W>::dot(pre[r][j], xs + xs_chunk<W, PAD>(c));
            }
        }
        int c = lane + kPre * Q3T_WARP;
        for (; c + (kUnroll - 1) * Q3T_WARP < nvec; c += kUnroll * Q3T_WARP) {
            uint4 u[NR][kUnroll];
#pragma unroll
            for (int r = 0; r < NR; ++r)
#pragma unroll
                for (int j = 0; j < kUnroll; ++j) u[r][j] = reinterpret_cast<const uint4*>(rows[r])[c + j * Q3T_WARP];
#pragma unroll
            for (int j = 0; j < kUnroll; ++j)
#pragma unroll
                for (int r = 0; r < NR; ++r) acc[r] += Vec<W>::dot(u[r][j], xs + xs_chunk<W, PAD>(c + j * Q3T_WARP));
        }
        for (; c < nvec; c += Q3T_WARP)
#pragma unroll
            for (int r = 0; r < NR; ++r) acc[r] += Vec<W>::dot(reinterpret_cast<const uint4*>(rows[r])[c], xs + xs_chunk<W, PAD>(c));
    } else {
#pragma unroll
        for (int r = 0; r < NR; ++r)
            for (int i = lane; i < k; i += Q3T_WARP) acc[r] += Elem<W>::load(rows[r], i) * xs[i];
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = warp_sum(acc[r]);
    if (lane != 0) return;
    if (row_scaled<W>()) {
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] = __fmul_rn(acc[r], ws[r]);  // not contracted into the bias or add
    }
    if (MODE == Q3T_GEMV_SWIGLU) {
        // silu(g) = g * sigmoid(g) = g / (1 + exp(-g)), in float32 as torch does it.
        const float g = acc[0], u = acc[NR - 1];
        y[out] = (g / (1.0f + expf(-g))) * u;
    } else if (MODE == Q3T_GEMV_ADD) {
        y[out] = y_old + acc[0];
    } else {
        y[out] = bias ? acc[0] + bias[out] : acc[0];
    }
}

template <typename W, int MODE>
int launch(const void* w, const float* w_scale, int n_rows, int k, const float* x, const float* norm_w, float eps, const float* bias, float* y,
           cudaStream_t s) {
    const int n_out = MODE == Q3T_GEMV_SWIGLU ? n_rows / 2 : n_rows;
    const int per_block = kThreads / q3t_host_warp();
    const dim3 grid((n_out + per_block - 1) / per_block);
    const bool vec = (k % Vec<W>::N) == 0 && (reinterpret_cast<uintptr_t>(w) % 16) == 0;
    const size_t smem = (size_t)xs_len(k, vec && xs_padded<W>()) * sizeof(float);
    const W* wp = static_cast<const W*>(w);
    if (vec)
        q3t_launch(k_gemv<W, MODE, true>, grid, kThreads, smem, s, wp, w_scale, n_out, k, x, norm_w, eps, bias, y);
    else
        q3t_launch(k_gemv<W, MODE, false>, grid, kThreads, smem, s, wp, w_scale, n_out, k, x, norm_w, eps, bias, y);
    return q3t_check_launch("q3t_gemv");
}

}  // namespace

extern "C" Q3T_API int q3t_gemv(int dtype, const void* w, const float* w_scale, int n_rows, int k, const float* x,
                                const float* norm_w, float eps, const float* bias, float* y, int mode, void* stream) {
    if (!w || !x || !y || n_rows <= 0 || k <= 0) return q3t_fail("q3t_gemv: bad arguments (n=%d k=%d)", n_rows, k);
    if (q3t_check_w_scale("q3t_gemv", dtype, w_scale)) return -1;
    if (k > 8192) return q3t_fail("q3t_gemv: k=%d exceeds 8192 (the input vector lives in shared memory)", k);
    if (mode == Q3T_GEMV_SWIGLU && (n_rows % 2)) return q3t_fail("q3t_gemv: SwiGLU needs an even row count, got %d", n_rows);
    if (mode != Q3T_GEMV_STORE && bias) return q3t_fail("q3t_gemv: bias is only supported with Q3T_GEMV_STORE");
    cudaStream_t s = Q3T_STREAM(stream);
#if defined(Q3T_CUDA)
    if (q3t_gemv_i8mma_takes(dtype, w, k, x, norm_w))
        return q3t_gemv_i8mma(w, w_scale, n_rows, k, x, 1, norm_w, eps, bias, y, mode, s);
#endif
    if (k <= 4096) return q3t_gemv_splitk(dtype, w, w_scale, n_rows, k, x, 1, norm_w, eps, bias, y, mode, s);
#define Q3T_GEMV_CASE(T)                                                                                   \
    switch (mode) {                                                                                        \
        case Q3T_GEMV_STORE: return launch<T, Q3T_GEMV_STORE>(w, w_scale, n_rows, k, x, norm_w, eps, bias, y, s);   \
        case Q3T_GEMV_ADD: return launch<T, Q3T_GEMV_ADD>(w, w_scale, n_rows, k, x, norm_w, eps, bias, y, s);       \
        case Q3T_GEMV_SWIGLU: return launch<T, Q3T_GEMV_SWIGLU>(w, w_scale, n_rows, k, x, norm_w, eps, bias, y, s); \
        default: return q3t_fail("q3t_gemv: unknown mode %d", mode);                                      \
    }
    if (dtype == Q3T_F32) { Q3T_GEMV_CASE(float) }
    if (dtype == Q3T_BF16) { Q3T_GEMV_CASE(uint16_t) }
    if (dtype == Q3T_I8) { Q3T_GEMV_CASE(int8_t) }
#undef Q3T_GEMV_CASE
    return q3t_fail("q3t_gemv: unknown dtype %d", dtype);
}

extern "C" Q3T_API int q3t_gemv_batch(int dtype, const void* w, const float* w_scale, int n_rows, int k, const float* x,
                                      int nb, const float* norm_w, float eps, const float* bias, float* y, int mode,
                                      void* stream) {
    if (!w || !x || !y || n_rows <= 0 || k <= 0) return q3t_fail("q3t_gemv_batch: bad arguments (n=%d k=%d)", n_rows, k);
    if (q3t_check_w_scale("q3t_gemv_batch", dtype, w_scale)) return -1;
    if (nb < 1 || nb > 2) return q3t_fail("q3t_gemv_batch: nb=%d, expected 1 or 2", nb);
    if (nb * xs_len(k, true) > 12288)  // the input vectors live in shared memory (48 KiB), padded (common.cuh)
        return q3t_fail("q3t_gemv_batch: nb * k = %d exceeds 12288 floats with its padding (%d)", nb * k, nb * xs_len(k, true));
    if (mode == Q3T_GEMV_SWIGLU && (n_rows % 2))
        return q3t_fail("q3t_gemv_batch: SwiGLU needs an even row count, got %d", n_rows);
    if (mode != Q3T_GEMV_STORE && bias) return q3t_fail("q3t_gemv_batch: bias is only supported with Q3T_GEMV_STORE");
#if defined(Q3T_CUDA)
    if (q3t_gemv_i8mma_takes(dtype, w, k, x, norm_w))
        return q3t_gemv_i8mma(w, w_scale, n_rows, k, x, nb, norm_w, eps, bias, y, mode, Q3T_STREAM(stream));
#endif
    return q3t_gemv_splitk(dtype, w, w_scale, n_rows, k, x, nb, norm_w, eps, bias, y, mode, Q3T_STREAM(stream));
}
