// The CodePredictor of one frame as one persistent kernel: 16 positions x n_layers layers and
// 15 draws, which the layer-by-layer path runs as ~510 launches.
//
// Why: at batch 1 a CodePredictor layer is 31 MB of weights in 5 dependent steps; as separate
// kernels each step pays a launch, a ramp-up and a tail, and the GPU sits mostly idle between them
// (the frame was launch-bound: ~6.5 us per kernel). Here one block per SM stays resident for the
// whole frame and the steps are phases separated by a grid-wide barrier (~1 us). Each GEMV phase
// issues its first weight loads *before* it waits at the barrier (weights do not depend on the
// previous phase), so the HBM latency overlaps the barrier.
//
// Phases per position p (p = 0: the Talker's final hidden state; p >= 1: the embedding of code p-1):
//   input   x = small_to_mtp_projection(src) (or a copy when there is none, 0.6B)
//   layer   qkv = W_qkv RMSNorm(x) | q/k RMSNorm + RoPE + KV append + attention (one block per q head)
//           | x += W_o attn | mlp = SwiGLU(W_gu RMSNorm(x)) | x += W_down mlp
//   head    logits[p-1] = lm_head[p-1] RMSNorm(x)        (p >= 1)
//   draw    codes[p] = sample(logits[p-1])  (block 0; sample_block.cuh, same draws as q3t_sample)
// Numerics are the layer-by-layer path's (float32 activations and accumulation, RMSNorm statistics
// in float32, RoPE without fused multiply-add, K/V rounded to the cache dtype before use); only
// the order of some float32 sums differs (split-K across warps).
//
// All blocks must be resident at once (the barrier spins): the grid is one block per SM, launched
// alone in its stream. Under PDL the next kernel is released only when every block has started.
#include "attention_short.cuh"
#include "sample_block.cuh"

namespace {
constexpr int kThreads = 512;
constexpr int kMaxSeq = kShortMaxSeq;  // CodePredictor cache positions (16 used)
constexpr int kMaxHeadDim = 256;
constexpr int kUnroll = 4;
constexpr int kLayerPtrs = 8;  // per layer: qkv, o, gate_up, down, in_norm, post_norm, q_norm, k_norm

template <typename W> using Vec = WeightVec16<W>;

struct Params {
    const void* const* weights;  // [n_layers * 8 layer pointers][n_codes lm_heads][n_codes input tables]
    int n_layers, n_codes, hidden, inter, hq, hkv, d, vocab, in_hidden, in_rows_first, in_rows;
    float eps, scale;
    const void* proj_w;
    const float* proj_b;
    const float* norm_w;
    const float *cos_tab, *sin_tab;
    void* cache;  // [n_layers, 2, n_codes + 1, hkv, d]
    const float* hn;
    int* codes;          // [n_codes + 1]: codes[0] is read, codes[1..] written
    const int* forced;   // NULL, or [n_codes + 1]: take these codes instead of drawing (tests)
    int flags;
    float temperature;
    int top_k;
    float top_p;
    const unsigned long long* seed_ptr;
    const int* step_ptr;
    float *x, *qkv, *attn, *mlp, *logits;  // logits [n_codes, vocab]
    unsigned* sync;                        // [2]: arrival count, generation; zero before the first launch
};

// Grid-wide barrier number `n` (1, 2, ... within one launch; every block passes them in the same
// order): each block adds one to the arrival count and waits until it reaches n x blocks. One
// atomic per block and no second broadcast step; the count is reset by the last block to leave
// the kernel (grid_exit). The release add / acquire load (fences on HIP) make each block's writes
// before the barrier visible to every block after it.
__device__ __forceinline__ void grid_barrier(unsigned* sync, unsigned& n) {
    ++n;
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned target = n * gridDim.x;
#if defined(Q3T_CUDA)
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(sync) : "memory");
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(sync) : "memory");
        } while (seen < target);
#else
        __threadfence();
        atomicAdd(sync, 1u);
        while (*(volatile unsigned*)sync < target) {
        }
        __threadfence();
#endif
    }
    __syncthreads();
}

// The last block out resets the arrival count for the next launch: every other block has passed
// its last barrier (and stopped reading the count) before it adds itself to sync[1].
__device__ __forceinline__ void grid_exit(unsigned* sync) {
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(sync + 1, 1u) == gridDim.x - 1) {
        atomicExch(sync, 0u);
        atomicExch(sync + 1, 0u);
    }
}

// The input vector of a phase: float32 activations, or (x == NULL) row *code of an embedding table
// (the code may be the previous phase's draw, so it is read only after the barrier).
template <typename W>
struct Source {
    const float* x;
    const W* table;
    const int* code;
    int rows;
    __device__ const W* row(int len) const {
        int c = q3t_ld_act(code);
        c = c < 0 ? 0 : (c >= rows ? rows - 1 : c);  // a bad id must not read out of bounds
        return table + (size_t)c * len;
    }
};
template <typename W>
__device__ __forceinline__ Source<W> act(const float* x) {
    return Source<W>{x, nullptr, nullptr, 0};
}

template <typename W, int MODE>
__device__ void phase_gemv(const W* __restrict__ w, int n_out, int k, Source<W> src,
                           const float* __restrict__ norm_w, float eps, const float* __restrict__ bias, float* y,
                           float* xs, float* red, float* part, unsigned* sync, unsigned& nb) {
    constexpr int NR = MODE == Q3T_GEMV_SWIGLU ? 2 : 1;
    constexpr int V = Vec<W>::N;
    constexpr int kPre = 8 / NR;
    const int lane = threadIdx.x % Q3T_WARP, warp = threadIdx.x / Q3T_WARP;
    const int wb = blockDim.x / Q3T_WARP;
    int s = 1;
    while (s * 2 <= wb && n_out * s * 2 <= (int)gridDim.x * wb) s *= 2;
    const int tpb = wb / s;
    const int team = blockIdx.x * tpb + warp / s, nteams = gridDim.x * tpb, member = warp % s;
    const int nvec = k / V;
    const int chunk = (nvec + s - 1) / s;
    const int lo = min(nvec, member * chunk), hi = min(nvec, lo + chunk);

    uint4 pre[NR][kPre];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        const uint4* row = reinterpret_cast<const uint4*>(w + (size_t)(NR * (team < n_out ? team : 0) + r) * k);
#pragma unroll
        for (int j = 0; j < kPre; ++j) {
            const int c = lo + lane + j * Q3T_WARP;
            pre[r][j] = (team < n_out && c < hi) ? row[c] : make_uint4(0, 0, 0, 0);
        }
    }

    grid_barrier(sync, nb);
    const float* x = src.x;
    const W* xw = x ? nullptr : src.row(k);
    float ss = 0.f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        const float v = x ? q3t_ld_act(x + i) : Elem<W>::load(xw, i);
        xs[i] = v;
        ss += v * v;
    }
    if (norm_w) {
        const float rs = rsqrtf(block_sum(ss, red) / (float)k + eps);
        for (int i = threadIdx.x; i < k; i += blockDim.x) xs[i] = norm_w[i] * (xs[i] * rs);
    }
    __syncthreads();

    const int iters = (n_out + nteams - 1) / nteams;
    for (int it = 0; it < iters; ++it) {
        const int out = team + it * nteams;
        const bool active = out < n_out;
        float acc[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] = 0.f;
        if (active) {
            const uint4* rows[NR];
#pragma unroll
            for (int r = 0; r < NR; ++r) rows[r] = reinterpret_cast<const uint4*>(w + (size_t)(NR * out + r) * k);
            int c = lo + lane;
            if (it == 0) {
#pragma unroll
                for (int j = 0; j < kPre; ++j) {
                    const int cj = lo + lane + j * Q3T_WARP;
                    if (cj < hi) {
#pragma unroll
                        for (int r = 0; r < NR; ++r) acc[r] += Vec<W>::dot(pre[r][j], xs + cj * V);
                    }
                }
                c = lo + lane + kPre * Q3T_WARP;
            }
            for (; c + (kUnroll - 1) * Q3T_WARP < hi; c += kUnroll * Q3T_WARP) {
                uint4 u[NR][kUnroll];
#pragma unroll
                for (int r = 0; r < NR; ++r)
#pragma unroll
                    for (int j = 0; j < kUnroll; ++j) u[r][j] = rows[r][c + j * Q3T_WARP];
#pragma unroll
                for (int j = 0; j < kUnroll; ++j)
#pragma unroll
                    for (int r = 0; r < NR; ++r) acc[r] += Vec<W>::dot(u[r][j], xs + (c + j * Q3T_WARP) * V);
            }
            for (; c < hi; c += Q3T_WARP)
#pragma unroll
                for (int r = 0; r < NR; ++r) acc[r] += Vec<W>::dot(rows[r][c], xs + c * V);
        }
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r] = warp_sum(acc[r]);
        if (s > 1) {
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < NR; ++r) part[warp * NR + r] = acc[r];
            __syncthreads();
            if (member == 0) {
#pragma unroll
                for (int r = 0; r < NR; ++r) {
                    float t = 0.f;
                    for (int m = 0; m < s; ++m) t += part[(warp + m) * NR + r];
                    acc[r] = t;
                }
            }
            __syncthreads();
        }
        if (!active || lane != 0 || member != 0) continue;
        if (MODE == Q3T_GEMV_SWIGLU) {
            const float g = acc[0], u = acc[NR - 1];
            y[out] = (g / (1.0f + expf(-g))) * u;
        } else if (MODE == Q3T_GEMV_ADD) {
            y[out] = q3t_ld_act(y + out) + acc[0];
        } else {
            y[out] = bias ? acc[0] + bias[out] : acc[0];
        }
    }
}

// x = src (float32 activations or a weight-typed row), spread over the grid.
template <typename W>
__device__ void phase_copy(Source<W> src, int n, float* x, unsigned* sync, unsigned& nb) {
    grid_barrier(sync, nb);
    const W* row = src.x ? nullptr : src.row(n);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = src.x ? q3t_ld_act(src.x + i) : Elem<W>::load(row, i);
}

// q/k RMSNorm + RoPE, K/V append, attention (attention_short.cuh), after the barrier.
template <typename C>
__device__ void phase_attention(const Params& p, const float* __restrict__ qn, const float* __restrict__ kn, int pos,
                                C* kc, C* vc, float* sm, float* red, unsigned* sync, unsigned& nb) {
    grid_barrier(sync, nb);
    rope_attention_heads<C>(p.qkv, qn, kn, p.eps, p.cos_tab, p.sin_tab, pos, p.hq, p.hkv, p.d, p.scale, kc, vc, p.attn,
                            sm, reinterpret_cast<C*>(sm + 3 * p.d + kMaxSeq), red);
}

template <typename W>
__global__ void __launch_bounds__(kThreads, 1) k_code_predictor(Params p) {
    q3t_grid_dep();
    extern __shared__ float4 smem4[];  // max(k floats, short_smem_bytes, 2 vocab floats)
    float* smem = reinterpret_cast<float*>(smem4);
    __shared__ float red[32];
    __shared__ float part[2 * 32];
    const int q_rows = (p.hq + 2 * p.hkv) * p.d;
    const size_t cache_half = (size_t)(p.n_codes + 1) * p.hkv * p.d;
    const W* const* wt = reinterpret_cast<const W* const*>(p.weights);
    const W* proj = static_cast<const W*>(p.proj_w);
    unsigned nb = 0;  // grid barriers passed
    for (int pos = 0; pos <= p.n_codes; ++pos) {
        Source<W> src = act<W>(p.hn);
        if (pos > 0)
            src = Source<W>{nullptr, wt[p.n_layers * kLayerPtrs + p.n_codes + pos - 1], p.codes + pos - 1,
                            pos == 1 ? p.in_rows_first : p.in_rows};
        if (proj)
            phase_gemv<W, Q3T_GEMV_STORE>(proj, p.hidden, p.in_hidden, src, nullptr, 0.f, p.proj_b, p.x, smem, red,
                                          part, p.sync, nb);
        else
            phase_copy<W>(src, p.hidden, p.x, p.sync, nb);
        for (int l = 0; l < p.n_layers; ++l) {
            const void* const* L = p.weights + (size_t)l * kLayerPtrs;
            W* kc = static_cast<W*>(p.cache) + (size_t)(2 * l) * cache_half;
            phase_gemv<W, Q3T_GEMV_STORE>(static_cast<const W*>(L[0]), q_rows, p.hidden, act<W>(p.x),
                                          static_cast<const float*>(L[4]), p.eps, nullptr, p.qkv, smem, red, part,
                                          p.sync, nb);
            phase_attention<W>(p, static_cast<const float*>(L[6]), static_cast<const float*>(L[7]), pos, kc,
                               kc + cache_half, smem, red, p.sync, nb);
            phase_gemv<W, Q3T_GEMV_ADD>(static_cast<const W*>(L[1]), p.hidden, p.hq * p.d, act<W>(p.attn), nullptr,
                                        0.f, nullptr, p.x, smem, red, part, p.sync, nb);
            phase_gemv<W, Q3T_GEMV_SWIGLU>(static_cast<const W*>(L[2]), p.inter, p.hidden, act<W>(p.x),
                                           static_cast<const float*>(L[5]), p.eps, nullptr, p.mlp, smem, red, part,
                                           p.sync, nb);
            phase_gemv<W, Q3T_GEMV_ADD>(static_cast<const W*>(L[3]), p.hidden, p.inter, act<W>(p.mlp), nullptr, 0.f,
                                        nullptr, p.x, smem, red, part, p.sync, nb);
        }
        if (pos == 0) continue;
        float* logits = p.logits + (size_t)(pos - 1) * p.vocab;
        phase_gemv<W, Q3T_GEMV_STORE>(wt[p.n_layers * kLayerPtrs + pos - 1], p.vocab, p.hidden, act<W>(p.x), p.norm_w,
                                      p.eps, nullptr, logits, smem, red, part, p.sync, nb);
        grid_barrier(p.sync, nb);
        if (blockIdx.x == 0) {
            if (p.forced) {
                if (threadIdx.x == 0) p.codes[pos] = p.forced[pos];
            } else {
                const int step = p.step_ptr ? *p.step_ptr : 0;
                sample_block<kThreads>(logits, p.vocab, nullptr, 1.0f, -1, 0, 0, 0, p.flags, p.temperature, p.top_k,
                                       p.top_p, step, draw_bits(p.seed_ptr, pos, step), p.codes + pos, smem,
                                       reinterpret_cast<int*>(smem + p.vocab));
            }
        }
    }
    grid_exit(p.sync);
}
}  // namespace

extern "C" Q3T_API int q3t_code_predictor(int dtype, const void* const* weights, int n_layers, int n_codes, int hidden,
                                          int inter, int hq, int hkv, int d, int vocab, int in_hidden,
                                          int in_rows_first, int in_rows, float eps, float scale, const void* proj_w,
                                          const float* proj_b, const float* norm_w, const float* cos_tab,
                                          const float* sin_tab, void* cache, const float* hn, int* codes,
                                          const int* forced, int flags, float temperature, int top_k, float top_p,
                                          const unsigned long long* seed_ptr, const int* step_ptr, float* x,
                                          float* qkv, float* attn, float* mlp, float* logits, unsigned int* sync,
                                          void* stream) {
    if (!weights || !norm_w || !cos_tab || !sin_tab || !cache || !hn || !codes || !step_ptr || !x || !qkv || !attn ||
        !mlp || !logits || !sync || (proj_w && !proj_b))
        return q3t_fail("q3t_code_predictor: null pointer");
    const int v = dtype == Q3T_BF16 ? 8 : 4;  // weights per 16-byte load
    if (n_layers <= 0 || n_codes <= 0 || n_codes + 1 > kMaxSeq || hq <= 0 || hkv <= 0 || hq % hkv || d <= 0 ||
        d > kMaxHeadDim || d % 2 || d > kThreads || vocab <= 0 || vocab > kSampleMaxV || hidden % v || inter % v ||
        (hq * d) % v || in_hidden % v || (!proj_w && in_hidden != hidden) || in_rows_first <= 0 || in_rows <= 0 ||
        (n_codes + 1) * d > kShortMaxElems)
        return q3t_fail("q3t_code_predictor: bad shape (layers=%d codes=%d hidden=%d inter=%d hq=%d hkv=%d d=%d vocab=%d "
                        "in_hidden=%d)", n_layers, n_codes, hidden, inter, hq, hkv, d, vocab, in_hidden);
    if (dtype != Q3T_F32 && dtype != Q3T_BF16) return q3t_fail("q3t_code_predictor: unknown dtype %d", dtype);
    const int blocks = q3t_host_sms();
    if (blocks <= 0) return q3t_fail("q3t_code_predictor: call q3t_init first");
    int k_max = hidden > inter ? hidden : inter;
    k_max = k_max > hq * d ? k_max : hq * d;
    k_max = k_max > in_hidden ? k_max : in_hidden;
    const size_t attn_bytes = dtype == Q3T_F32 ? short_smem_bytes<float>(d, n_codes + 1)
                                               : short_smem_bytes<uint16_t>(d, n_codes + 1);
    int floats = k_max > 2 * vocab ? k_max : 2 * vocab;
    const size_t smem = (size_t)floats * sizeof(float) > attn_bytes ? (size_t)floats * sizeof(float) : attn_bytes;
    Params p = {weights, n_layers, n_codes, hidden, inter, hq, hkv, d, vocab, in_hidden, in_rows_first, in_rows,
                eps, scale, proj_w, proj_b, norm_w, cos_tab, sin_tab, cache, hn, codes, forced,
                flags, temperature, top_k, top_p, seed_ptr, step_ptr, x, qkv, attn, mlp, logits, sync};
    cudaStream_t s = Q3T_STREAM(stream);
    if (dtype == Q3T_F32)
        q3t_launch(k_code_predictor<float>, blocks, kThreads, smem, s, p);
    else
        q3t_launch(k_code_predictor<uint16_t>, blocks, kThreads, smem, s, p);
    return q3t_check_launch("q3t_code_predictor");
}
