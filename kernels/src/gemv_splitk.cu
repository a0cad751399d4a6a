// The split-K GEMV: the same function as gemv.cu's row kernel (RMSNorm-fused matrix-vector
// product with store (+bias), residual add or interleaved SwiGLU), laid out to keep every SM busy
// on the decode loop's small matrices; q3t_gemv takes it for K <= 4096, q3t_gemv_batch always.
//
// - In-block split-K: a block of 256 threads handles per_block = warps / splits outputs
//   (row units: one row, or a gate/up row pair for SwiGLU); the `splits` warps of one unit
//   take interleaved 16-byte-per-lane chunks of its row (chunk j of the row goes to warp
//   j % splits, so each warp still reads whole 512-byte (wave64: 1 KiB) runs, coalesced).
//   Their partial sums meet in shared memory and are added in a fixed order, so results stay
//   run-to-run identical (no atomics, no second pass, no scratch buffer).
//   The host picks `splits` (a power of two up to the warps per block): at least enough that no
//   lane has more than kMaxPre 16-byte loads per unit, and, of the larger ones that leave every
//   warp a chunk, the one whose grid takes the fewest waves at the occupancy its kernel really
//   gets (queried from the runtime), the largest grid among those. E.g. (H200, 132 SMs, bf16):
//   CodePredictor o_proj 1024x2048 and down_proj 1024x3072 go from 128 blocks (one warp per row)
//   to 512 (4 per SM, one wave), the lm_heads 2048x1024 from 256 to 512, the gate/up 6144x1024
//   SwiGLU to 384 blocks of 8 loads per lane (3 per SM, one wave, where 768 blocks would take two).
// - All of a lane's weight loads (up to kMaxPre = 8, i.e. 128 bytes per lane) go out before
//   the kernel waits for its predecessor (programmatic dependent launch), and really do in the
//   SASS (see the wait below), for every real shape of both model sizes; a loop of 4 per row per
//   round only serves larger rows. The kernel is instantiated for 2, 4 or 8 up-front loads, so
//   short rows do not pay registers (occupancy) for the longest.
// - The RMSNorm scale is applied after the dot product: shared memory holds x * norm_w (x and
//   norm_w loaded in one pass), sum(x^2) is reduced per warp, and every output is multiplied by
//   rsqrt(mean(x^2) + eps) at the end. One barrier before the dot products instead of three and
//   one dependent global round trip instead of two; the result differs from the row kernel only by
//   float32 rounding (rs * sum(w * (g * x)) vs sum(w * (g * (x * rs)))).
// - int8 weights (Q3T_I8): a 16-byte load holds 16 of them (bf16: 8), so a row takes half the loads;
//   each is widened in registers (common.cuh), and the row's scale multiplies its finished sum, after
//   the RMS scale. The scales are loaded with the weights, before the wait.
#include "common.cuh"

#include <mutex>

namespace {

constexpr int kThreads = 256;
constexpr int kMaxPre = 8;  // 16-byte weight loads per lane issued before the first use

template <typename W> using Pack = WeightVec16<W>;

// PRE: 16-byte loads per lane issued up front, over all NR rows of the unit (VEC only).
// NB: input vectors (x [NB, k] -> y [NB, n_out]): the CodePredictor's first two positions go
// through its layers together, each weight row read once for both (q3t_gemv_batch).
// stage_x (common.cuh) for two vectors x [2, k] into xs [2, k], the loads of both in flight together
// (K <= 2048: one round trip). Each thread adds its elements in stage_x's order, so ss0 and ss1 are
// the sums a one-vector call gets, bit for bit.
// xs holds vector b at b * xs_len(k, pad), padded as stage_x's.
__device__ __forceinline__ void stage_x_pair(const float* __restrict__ x, const float* __restrict__ g, int k,
                                             float* __restrict__ xs, float& ss0, float& ss1, bool pad) {
    const int kp = xs_len(k, pad);
    ss0 = ss1 = 0.f;
    const bool vec = k % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(g) % 16 == 0;
    if (!vec) {
        for (int i = threadIdx.x; i < k; i += blockDim.x) {
            const float v0 = x[i], v1 = x[k + i], gi = g ? g[i] : 1.f;
            xs[xs_at(i, pad)] = g ? v0 * gi : v0;
            xs[kp + xs_at(i, pad)] = g ? v1 * gi : v1;
            ss0 += v0 * v0;
            ss1 += v1 * v1;
        }
        return;
    }
    const float4* xv = reinterpret_cast<const float4*>(x);
    const float4* gv = reinterpret_cast<const float4*>(g);
    float4* xsv = reinterpret_cast<float4*>(xs);
    const int k4 = k / 4;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f), one = make_float4(1.f, 1.f, 1.f, 1.f);
    const int pstride = pad ? blockDim.x + (blockDim.x >> 3) : blockDim.x;  // as stage_x's
    float4* xsv1 = xsv + kp / 4;
    for (int i0 = threadIdx.x; i0 < k4; i0 += 2 * blockDim.x) {
        const int p0 = pad ? i0 + (i0 >> 3) : i0;
        float4 a[2][2], w[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int i = i0 + j * blockDim.x;
            a[0][j] = i < k4 ? xv[i] : zero;
            a[1][j] = i < k4 ? xv[k4 + i] : zero;
            w[j] = one;  // not `c ? gv[i] : one`: clang selects between the two addresses, `one` in scratch
            if (g && i < k4) w[j] = gv[i];
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int i = i0 + j * blockDim.x;
            if (i < k4) {
#pragma unroll
                for (int b = 0; b < 2; ++b) {
                    const float4 v = a[b][j];
                    (b ? ss1 : ss0) += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
                    (b ? xsv1 : xsv)[p0 + j * pstride] =
                        g ? make_float4(v.x * w[j].x, v.y * w[j].y, v.z * w[j].z, v.w * w[j].w) : v;
                }
            }
        }
    }
}

template <typename W, int MODE, bool VEC, int PRE, int NB>
__device__ __forceinline__ void gemv2(const W* __restrict__ w, const float* __restrict__ w_scale, int n_out, int k, int splits, const float* __restrict__ x,
                                      const float* __restrict__ norm_w, float eps, const float* __restrict__ bias,
                                      float* __restrict__ y) {
    constexpr int NR = MODE == Q3T_GEMV_SWIGLU ? 2 : 1;  // weight rows per output
    constexpr int PR = PRE / NR;                         // up-front loads per row
    static_assert(PR >= 1 && PR * NR == PRE, "PRE must be a multiple of the rows per output");
    static_assert(NB >= 1 && NB <= 2, "one or two input vectors");
    constexpr int V = Pack<W>::N;
    extern __shared__ float xs[];     // NB vectors of xs_len(k) floats: x (times norm_w when given); 16-byte aligned
    __shared__ float red[NB][32];     // per-warp sum of x^2
    __shared__ float part[32][NB][NR];  // per-warp partial dot products
    const int lane = threadIdx.x % Q3T_WARP, warp = threadIdx.x / Q3T_WARP;
    const int nwarps = blockDim.x / Q3T_WARP;
    const int per_block = nwarps / splits;
    const int unit = blockIdx.x * per_block + warp / splits;
    const bool active = unit < n_out;
    const int step = splits * Q3T_WARP;                 // between a lane's consecutive vectors / elements
    const int first = (warp % splits) * Q3T_WARP + lane;  // this lane's first vector / element
    const int nvec = VEC ? k / V : 0;
    const W* rows[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) rows[r] = w + (size_t)(NR * (active ? unit : 0) + r) * k;

    // Weights never change: their loads go out before waiting for the previous kernel.
    uint4 pre[NR][PR];
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int j = 0; j < PR; ++j) {
            const int c = first + j * step;
            pre[r][j] = (VEC && active && c < nvec) ? reinterpret_cast<const uint4*>(rows[r])[c] : make_uint4(0, 0, 0, 0);
        }

    // The row scales of the output this thread finishes (int8; weights too, so loaded before the wait).
    float ws[NR];
    {
        const int mine = (int)(blockIdx.x * per_block + threadIdx.x);
#pragma unroll
        for (int r = 0; r < NR; ++r)
            ws[r] = row_scaled<W>() && (int)threadIdx.x < per_block && mine < n_out ? w_scale[(size_t)NR * mine + r] : 1.f;
    }

    // ptxas schedules griddepcontrol.wait (SASS: ACQBULK) above independent loads of the same
    // basic block, so the "early" weight loads would in fact be issued after the wait. Behind a
    // branch on a kernel argument (k > 0 always holds here) it stays below them;
    // tests/test_native_build.py checks the order in the SASS.
    float y_old[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) y_old[b] = 0.f;
    if (k > 0) {
        q3t_grid_dep();
        // Residual add: this block's residual values go out with x's loads below (one round trip).
        const int mine = (int)(blockIdx.x * per_block + threadIdx.x);  // the output this thread finishes
        if (MODE == Q3T_GEMV_ADD && (int)threadIdx.x < per_block && mine < n_out)
#pragma unroll
            for (int b = 0; b < NB; ++b) y_old[b] = y[(size_t)b * n_out + mine];
    }
    float ss[NB];  // xs = x * norm_w (padded for the 16-byte loads, common.cuh); the RMS scale is applied at the end
    constexpr bool PAD = VEC && xs_padded<W>();
    const int kp = xs_len(k, PAD);  // floats between the vectors in xs
    if constexpr (NB == 1)
        ss[0] = stage_x(x, norm_w, k, xs, PAD);
    else
        stage_x_pair(x, norm_w, k, xs, ss[0], ss[1], PAD);
    if (norm_w) {
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            ss[b] = warp_sum(ss[b]);
            if (lane == 0) red[b][warp] = ss[b];
        }
    }
    __syncthreads();

    float acc[NB][NR];
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[b][r] = 0.f;
    if (active) {
        if constexpr (VEC) {
            // The up-front chunks' x: chunks `step` apart (a multiple of 8) sit xstride floats apart.
            const float* x0 = xs + xs_chunk<W, PAD>(first);
            const int xstride = xs_chunk<W, PAD>(step);
#pragma unroll
            for (int j = 0; j < PR; ++j) {
                const int c = first + j * step;
                if (c < nvec) {
#pragma unroll
                    for (int b = 0; b < NB; ++b)
#pragma unroll
                        for (int r = 0; r < NR; ++r) acc[b][r] += Pack<W>::dot(pre[r][j], x0 + b * kp + j * xstride);
                }
            }
            // Rows longer than the up-front loads (the host picks PRE < kMaxPre only when none are
            // left; not met by the real shapes at kMaxPre either): 4 per row per round, then the tail.
            int c = first + PR * step;
            if constexpr (PRE == kMaxPre) for (; c + 3 * step < nvec; c += 4 * step) {
                uint4 u[NR][4];
#pragma unroll
                for (int r = 0; r < NR; ++r)
#pragma unroll
                    for (int j = 0; j < 4; ++j) u[r][j] = reinterpret_cast<const uint4*>(rows[r])[c + j * step];
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int b = 0; b < NB; ++b)
#pragma unroll
                        for (int r = 0; r < NR; ++r)
                            acc[b][r] += Pack<W>::dot(u[r][j], xs + b * kp + xs_chunk<W, PAD>(c + j * step));
            }
            for (; c < nvec; c += step)
#pragma unroll
                for (int r = 0; r < NR; ++r) {
                    const uint4 u = reinterpret_cast<const uint4*>(rows[r])[c];
#pragma unroll
                    for (int b = 0; b < NB; ++b) acc[b][r] += Pack<W>::dot(u, xs + b * kp + xs_chunk<W, PAD>(c));
                }
        } else {
            // Rows not 16-byte aligned (k not a multiple of the vector width, or an offset pointer).
            for (int i = first; i < k; i += step)
#pragma unroll
                for (int r = 0; r < NR; ++r) {
                    const float wv = Elem<W>::load(rows[r], i);
#pragma unroll
                    for (int b = 0; b < NB; ++b) acc[b][r] += wv * xs[b * kp + i];  // PAD false: kp = k
                }
        }
    }
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[b][r] = warp_sum(acc[b][r]);
    if (lane == 0) {
#pragma unroll
        for (int b = 0; b < NB; ++b)
#pragma unroll
            for (int r = 0; r < NR; ++r) part[warp][b][r] = acc[b][r];
    }
    __syncthreads();

    // One thread per output of the block adds its warps' partial sums in a fixed order.
    if ((int)threadIdx.x >= per_block) return;
    const int out = blockIdx.x * per_block + threadIdx.x;
    if (out >= n_out) return;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        const float scale = norm_w ? rms_scale(red[b], nwarps, k, eps) : 1.f;
        float sum[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            float t = 0.f;
            for (int j = 0; j < splits; ++j) t += part[threadIdx.x * splits + j][b][r];
            sum[r] = t * scale;
            if (row_scaled<W>()) sum[r] = __fmul_rn(sum[r], ws[r]);  // not contracted into the bias or add
        }
        float* yb = y + (size_t)b * n_out;
        if (MODE == Q3T_GEMV_SWIGLU) {
            // silu(g) = g * sigmoid(g) = g / (1 + exp(-g)), in float32 as torch does it.
            const float g = sum[0], u = sum[NR - 1];
            yb[out] = (g / (1.0f + expf(-g))) * u;
        } else if (MODE == Q3T_GEMV_ADD) {
            yb[out] = y_old[b] + sum[0];
        } else {
            yb[out] = bias ? sum[0] + bias[out] : sum[0];
        }
    }
}

// One input vector, and two (q3t_gemv_batch). Two kernels rather than one template so the
// one-vector kernel keeps its register allocation. The two-vector one asks for 4 blocks per SM
// (bf16; 3 for float32, whose residual-add kernels would spill at 64 registers; with 8 up-front
// loads 3 for bf16 (80 registers, as the one-vector kernel) and 2 for float32): the one-vector
// kernels of the CodePredictor's shapes fit 4 blocks per SM too, so a grid of 512 blocks runs in
// one wave, where 3 per SM would take two (1.8x the time of one vector per kernel on the H200).
// The one-vector kernel with 8 up-front loads asks for 3 blocks per SM (bf16: 80 registers, no
// spills; ptxas' own choice was 88-92, 2 per SM), so the grids the wave rule picks for it (the
// 0.6B gate/up: 384 blocks) run in one wave on the H200's 132 SMs.
template <typename W, int PRE>
constexpr int x1_min_blocks() {
    return PRE == kMaxPre && sizeof(W) <= 2 ? 3 : 0;  // 0: no minimum, ptxas chooses (int8 as bf16)
}
template <typename W, int MODE, bool VEC, int PRE>
__global__ void Q3T_LAUNCH_BOUNDS(kThreads, (x1_min_blocks<W, PRE>()))
    k_gemv2(const W* __restrict__ w, const float* __restrict__ w_scale, int n_out, int k, int splits,
            const float* __restrict__ x, const float* __restrict__ norm_w, float eps, const float* __restrict__ bias,
            float* __restrict__ y) {
    gemv2<W, MODE, VEC, PRE, 1>(w, w_scale, n_out, k, splits, x, norm_w, eps, bias, y);
}
template <typename W, int PRE>
constexpr int x2_min_blocks() {
    // int8 with 8 up-front loads: 2 (at 3 it spilled with x padded; no real shape of either size takes it)
    return PRE == kMaxPre ? (sizeof(W) == 2 ? 3 : 2) : (sizeof(W) <= 2 ? 4 : 3);
}
template <typename W, int MODE, bool VEC, int PRE>
__global__ void Q3T_LAUNCH_BOUNDS(kThreads, (x2_min_blocks<W, PRE>()))
    k_gemv2x2(const W* __restrict__ w, const float* __restrict__ w_scale, int n_out, int k, int splits,
              const float* __restrict__ x, const float* __restrict__ norm_w, float eps, const float* __restrict__ bias,
              float* __restrict__ y) {
    gemv2<W, MODE, VEC, PRE, 2>(w, w_scale, n_out, k, splits, x, norm_w, eps, bias, y);
}

inline int cdiv(int a, int b) { return (a + b - 1) / b; }

template <typename W>
using GemvKernel = void (*)(const W*, const float*, int, int, int, const float*, const float*, float, const float*,
                            float*);

// The kernel for NB input vectors with `loads` 16-byte weight loads per lane (rounded up to 2, 4 or 8).
template <typename W, int MODE, int NB>
GemvKernel<W> pick_kernel(bool vec, int loads) {
    if (!vec) return NB == 1 ? k_gemv2<W, MODE, false, 2> : k_gemv2x2<W, MODE, false, 2>;
    if (loads <= 2) return NB == 1 ? k_gemv2<W, MODE, true, 2> : k_gemv2x2<W, MODE, true, 2>;
    if (loads <= 4) return NB == 1 ? k_gemv2<W, MODE, true, 4> : k_gemv2x2<W, MODE, true, 4>;
    return NB == 1 ? k_gemv2<W, MODE, true, kMaxPre> : k_gemv2x2<W, MODE, true, kMaxPre>;
}

template <typename W, int MODE, int NB>
int launch2(const void* w, const float* w_scale, int n_rows, int k, const float* x, const float* norm_w, float eps, const float* bias,
            float* y, cudaStream_t s) {
    constexpr int NR = MODE == Q3T_GEMV_SWIGLU ? 2 : 1;
    const int n_out = n_rows / NR;
    const int warp = q3t_host_warp();
    const int nwarps = kThreads / warp;  // 8 (warp 32) or 4 (wave64): a power of two
    const bool vec = (k % Pack<W>::N) == 0 && (reinterpret_cast<uintptr_t>(w) % 16) == 0;
    const int chunks = cdiv(vec ? k / Pack<W>::N : k, warp);  // one chunk: one vector (or element) per lane
    const int sms = q3t_host_sms();
    // The same split for any NB (chosen by the one-vector kernels), so each vector's outputs are
    // those of a one-vector call, bit for bit. The fewest splits first: no lane has more than
    // kMaxPre up-front loads per unit.
    int splits = 1;
    while (splits < nwarps && NR * cdiv(chunks, splits) > kMaxPre) splits *= 2;
    const size_t smem1 = (size_t)xs_len(k, vec && xs_padded<W>()) * sizeof(float);
    // Waves: of the splits that leave every warp at least one chunk, the one whose grid takes the
    // fewest waves at its kernel's real occupancy, and among those the largest grid. A partial
    // second wave costs a whole block's latency again (its blocks load their weights only when the
    // first wave's leave): the 0.6B gate/up in 384 blocks (one wave) rather than 768 (two at 3 per SM).
    int best = splits, best_waves = 0, best_grid = 0;
    for (int sp = splits; sp <= nwarps && (sp == splits || chunks >= sp); sp *= 2) {
        const int grid = cdiv(n_out, nwarps / sp);
        const auto kernel = pick_kernel<W, MODE, 1>(vec, NR * cdiv(chunks, sp));
        const int slots = q3t_blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads, smem1) * (sms > 0 ? sms : 1);
        const int waves = cdiv(grid, slots);
        // int8 rows have half the 16-byte chunks of bf16 rows: with q3t_set_i8_deep, the smaller grid of equal
        // waves, so each lane keeps as many bytes in flight as a bf16 lane.
        const bool deeper = sizeof(W) == 1 && q3t_i8_deep();
        if (best_waves == 0 || waves < best_waves || (waves == best_waves && (deeper ? grid < best_grid : grid > best_grid))) {
            best = sp;
            best_waves = waves;
            best_grid = grid;
        }
    }
    splits = best;
    const dim3 grid(cdiv(n_out, nwarps / splits));
    const size_t smem = (size_t)NB * smem1;
    const auto kernel = pick_kernel<W, MODE, NB>(vec, NR * cdiv(chunks, splits));
    q3t_launch(kernel, grid, kThreads, smem, s, static_cast<const W*>(w), w_scale, n_out, k, splits, x, norm_w, eps,
               bias, y);
    return q3t_check_launch(NB == 1 ? "q3t_gemv" : "q3t_gemv_batch");
}

}  // namespace

// Blocks of `kernel` resident on one SM/CU with `threads` threads and `smem` bytes of dynamic shared memory.
// Cached: the answer never changes, and the launchers also run during graph capture.
int q3t_blocks_per_sm(const void* kernel, int threads, size_t smem) {
    struct Entry {
        const void* kernel;
        int threads;
        size_t smem;
        int blocks;
    };
    static Entry cache[128];
    static int used = 0;
    static std::mutex lock;
    std::lock_guard<std::mutex> hold(lock);
    for (int i = 0; i < used; ++i)
        if (cache[i].kernel == kernel && cache[i].threads == threads && cache[i].smem == smem) return cache[i].blocks;
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem) != cudaSuccess || blocks < 1) {
        (void)cudaGetLastError();  // a failed query is not a launch error: assume one block per SM
        blocks = 1;
    }
    if (used < 128) cache[used++] = {kernel, threads, smem, blocks};
    return blocks;
}

// Called by q3t_gemv (gemv.cu) for K <= 4096 after it has checked the arguments, and by
// q3t_gemv_batch (nb 1 or 2).
int q3t_gemv_splitk(int dtype, const void* w, const float* w_scale, int n_rows, int k, const float* x, int nb,
                    const float* norm_w, float eps, const float* bias, float* y, int mode, cudaStream_t s) {
#define Q3T_GEMV2_CASE(T, NB)                                                                                          \
    switch (mode) {                                                                                                    \
        case Q3T_GEMV_STORE: return launch2<T, Q3T_GEMV_STORE, NB>(w, w_scale, n_rows, k, x, norm_w, eps, bias, y, s);   \
        case Q3T_GEMV_ADD: return launch2<T, Q3T_GEMV_ADD, NB>(w, w_scale, n_rows, k, x, norm_w, eps, bias, y, s);       \
        case Q3T_GEMV_SWIGLU: return launch2<T, Q3T_GEMV_SWIGLU, NB>(w, w_scale, n_rows, k, x, norm_w, eps, bias, y, s); \
        default: return q3t_fail("q3t_gemv: unknown mode %d", mode);                                                    \
    }
    if (nb != 1 && nb != 2) return q3t_fail("q3t_gemv_batch: nb=%d, expected 1 or 2", nb);
    if (dtype == Q3T_F32) {
        if (nb == 1) { Q3T_GEMV2_CASE(float, 1) }
        Q3T_GEMV2_CASE(float, 2)
    }
    if (dtype == Q3T_BF16) {
        if (nb == 1) { Q3T_GEMV2_CASE(uint16_t, 1) }
        Q3T_GEMV2_CASE(uint16_t, 2)
    }
    if (dtype == Q3T_I8) {
        if (nb == 1) { Q3T_GEMV2_CASE(int8_t, 1) }
        Q3T_GEMV2_CASE(int8_t, 2)
    }
#undef Q3T_GEMV2_CASE
    return q3t_fail("q3t_gemv: unknown dtype %d", dtype);
}
