// q/k RMSNorm + rotate-half RoPE at `pos`, K/V append and attention over cache positions 0..pos
// for one q head per block: the short-context decode attention of the CodePredictor (16
// positions) of q3t_rope_attention and q3t_rope_attention_first (attention.cu); norm_rope_head and
// copy_kv_rows also serve the Talker's split attention.
// Split in two so the one-launch kernel can do the first part before it waits for its
// predecessor (programmatic dependent launch): short_history copies the earlier positions' K/V
// rows (written by kernels that finished long ago) and short_head_consts the head's constants
// (norm weights, RoPE row) while the previous kernel still runs; what is left after the wait is
// one round trip for this position's q/k/v and the arithmetic, all from shared memory.
// The block of the first q head of each KV group writes the cache row; every block uses its own
// copy of the new K/V, rounded to the cache dtype as the split path reads it back from the cache.
#pragma once

#include "common.cuh"

constexpr int kShortMaxSeq = 64;     // positions one block scores (one float each in shared memory)
constexpr int kShortMaxElems = 4096;  // max_seq * d: the K/V history rows fit in shared memory
constexpr int kShortThreads = 256;    // threads of a short-context block (d <= kShortThreads)

// The shapes the short-context kernels take (their K/V history and scores live in shared memory).
inline bool short_shape_ok(int hq, int hkv, int d, int max_seq) {
    return hq > 0 && hkv > 0 && hq % hkv == 0 && d > 0 && d <= kShortThreads && d % 2 == 0 && max_seq > 0 &&
           max_seq <= kShortMaxSeq && max_seq * d <= kShortMaxElems;
}

// Shared memory of one block: 3 d + kShortMaxSeq floats, then 2 max_seq d cache elements.
template <typename C>
__host__ __device__ constexpr size_t short_smem_bytes(int d, int max_seq) {
    return (size_t)(3 * d + kShortMaxSeq) * sizeof(float) + (size_t)2 * max_seq * d * sizeof(C);
}

template <typename C>
__device__ __forceinline__ float round_to(float v) {
    return v;
}
template <>
__device__ __forceinline__ float round_to<uint16_t>(float v) {
    return bf16_to_f32(f32_to_bf16(v));
}

// Rows first..first+n-1 of KV head kvh of both caches into kdst and vdst (n d elements each, row by
// row), block-wide. Read at L2 (other blocks and kernels wrote them). In 16-byte units, each thread's
// loads all issued before its stores, so a history of up to 16 bf16 rows of 128 is one round trip
// (element by element it was one per 256 elements). Needs a barrier before use.
template <typename C>
__device__ __forceinline__ void copy_kv_rows(const C* kc, const C* vc, int first, int n, int kvh, int hkv, int d,
                                             C* kdst, C* vdst) {
    constexpr int V = 16 / sizeof(C);
    constexpr int kBatch = 4;  // loads in flight per thread per round
    const bool vec = d % V == 0 && reinterpret_cast<uintptr_t>(kc) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(vc) % 16 == 0 && reinterpret_cast<uintptr_t>(kdst) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(vdst) % 16 == 0;
    if (!vec) {
        const int total = n * d;
        for (int e = threadIdx.x; e < total; e += blockDim.x) {
            const int t = e / d, i = e - t * d;
            const size_t at = ((size_t)(first + t) * hkv + kvh) * d + i;
            kdst[e] = q3t_ld_act(kc + at);
            vdst[e] = q3t_ld_act(vc + at);
        }
        return;
    }
    const int rv = d / V;      // 16-byte units per row
    const int units = n * rv;  // per cache
    for (int base = 0; base < 2 * units; base += kBatch * blockDim.x) {
        uint4 r[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const int e = base + j * blockDim.x + threadIdx.x;
            if (e < 2 * units) {
                const int u = e < units ? e : e - units;
                const int t = u / rv, c = u - t * rv;
                const C* src = (e < units ? kc : vc) + ((size_t)(first + t) * hkv + kvh) * d;
                r[j] = q3t_ld_act(reinterpret_cast<const uint4*>(src) + c);
            }
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const int e = base + j * blockDim.x + threadIdx.x;
            if (e < 2 * units) reinterpret_cast<uint4*>(e < units ? kdst : vdst)[e < units ? e : e - units] = r[j];
        }
    }
}

// Rows 0..pos-1 of KV head kvh into hist (K rows, then V rows: pos * d elements each).
template <typename C>
__device__ __forceinline__ void short_history(const C* kc, const C* vc, int pos, int kvh, int hkv, int d, C* hist) {
    copy_kv_rows<C>(kc, vc, 0, pos, kvh, hkv, d, hist, hist + (size_t)pos * d);
}

// What thread tid (< d) needs of the weights and tables: the q and k norm weights and the RoPE
// row of `pos` at its dimension.
struct ShortConsts {
    float qn, kn, c, s;
};
__device__ __forceinline__ ShortConsts short_head_consts(const float* __restrict__ qn, const float* __restrict__ kn,
                                                         const float* __restrict__ cos_tab,
                                                         const float* __restrict__ sin_tab, int pos, int d) {
    const int i = threadIdx.x;
    if (i >= d) return ShortConsts{0.f, 0.f, 0.f, 0.f};
    return ShortConsts{qn[i], kn[i], cos_tab[(size_t)pos * d + i], sin_tab[(size_t)pos * d + i]};
}

constexpr int kRopeMaxD = 256;  // head dims norm_rope_head takes (its normed-values scratch)

// This thread's element (tid < d) of head h's q and its KV group's k and v -> q and k RMSNorm'd
// and rotated (rotate-half RoPE at pos, two roundings like torch's separate multiplies), k and v
// rounded to the cache type, into qs, ks, vs (shared, d floats each); with append, also into the
// caches at row pos. red: 32 floats. Block-wide (barriers); needs d <= blockDim.x and d <= kRopeMaxD.
// Three barriers: the norms' partial sums (which also makes the caller's shared writes visible),
// the normed values (in a scratch array of their own, so the rotation's reads of a partner element
// need no barrier before qs and ks are overwritten), the results. Callers read red, qs, ks and vs
// only between this and their next call's first barrier (or after a barrier of their own).
template <typename C>
__device__ void norm_rope_head(float a, float b, float v, ShortConsts k, float eps, int d, int pos, int kvh, int hkv,
                               bool append, C* kc, C* vc, float* qs, float* ks, float* vs, float* red) {
    __shared__ float normed[2][kRopeMaxD];  // q, k after RMSNorm
    const int tid = threadIdx.x, lane = tid % Q3T_WARP, warp = tid / Q3T_WARP, nwarps = blockDim.x / Q3T_WARP;
    // Both sums of squares in one reduction (red[w]: q, red[16 + w]: k; nwarps <= 16).
    float sq = warp_sum(a * a), sk = warp_sum(b * b);
    if (lane == 0) {
        red[warp] = sq;
        red[16 + warp] = sk;
    }
    __syncthreads();
    sq = 0.f;
    sk = 0.f;
    for (int w = 0; w < nwarps; ++w) {
        sq += red[w];
        sk += red[16 + w];
    }
    const float rq = rsqrtf(sq / (float)d + eps), rk = rsqrtf(sk / (float)d + eps);
    if (tid < d) {
        normed[0][tid] = k.qn * (a * rq);
        normed[1][tid] = k.kn * (b * rk);
    }
    __syncthreads();
    const int half = d / 2;
    float qo = 0.f, ko = 0.f;
    if (tid < d) {
        const int i = tid;
        const float qr = i < half ? -normed[0][i + half] : normed[0][i - half];
        const float kr = i < half ? -normed[1][i + half] : normed[1][i - half];
        qo = __fadd_rn(__fmul_rn(normed[0][i], k.c), __fmul_rn(qr, k.s));
        ko = round_to<C>(__fadd_rn(__fmul_rn(normed[1][i], k.c), __fmul_rn(kr, k.s)));
    }
    if (tid < d) {
        qs[tid] = qo;
        ks[tid] = ko;
        vs[tid] = v;
        if (append) {
            const size_t at = ((size_t)pos * hkv + kvh) * d + tid;
            Elem<C>::store(kc, (int)at, ko);
            Elem<C>::store(vc, (int)at, v);
        }
    }
    __syncthreads();
}

// The attention of one query (qs, normed and rotated) over positions 0..pos: scores key(t, i) . qs
// (a warp per position), softmax, out[i] = sum_t p_t value(t, i) for the block's threads i < d.
// sc: kShortMaxSeq floats of shared memory. Every short attention runs these float32 operations in
// this order, so they agree bit for bit.
template <typename Key, typename Value>
__device__ __forceinline__ void short_attend(const float* qs, int pos, int d, float scale, Key key, Value value,
                                             float* sc, float* out) {
    const int tid = threadIdx.x, lane = tid % Q3T_WARP, warp = tid / Q3T_WARP, nwarps = blockDim.x / Q3T_WARP;
    for (int t = warp; t <= pos; t += nwarps) {
        float s = 0.f;
        for (int i = lane; i < d; i += Q3T_WARP) s += qs[i] * key(t, i);
        s = warp_sum(s);
        if (lane == 0) sc[t] = s * scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int t = 0; t <= pos; ++t) m = fmaxf(m, sc[t]);
    float l = 0.f;
    for (int t = 0; t <= pos; ++t) l += expf(sc[t] - m);
    if (tid < d) {
        float acc = 0.f;
        for (int t = 0; t <= pos; ++t) acc += expf(sc[t] - m) * value(t, tid);
        out[tid] = acc / l;
    }
}

// Head h: its q and the group's k, v from qkv [(hq + 2 hkv) d], with hist from short_history.
// sm: 3 d + kShortMaxSeq floats; red: 32 floats. Needs d <= blockDim.x.
template <typename C>
__device__ void short_head(const float* qkv, ShortConsts k, float eps, int pos, int h, int hq, int hkv, int d,
                           float scale, C* kc, C* vc, const C* hist, float* out, float* sm, float* red) {
    const int group = hq / hkv, kvh = h / group;
    const int tid = threadIdx.x;
    float* qs = sm;
    float* ks = sm + d;
    float* vs = sm + 2 * d;
    float* sc = sm + 3 * d;  // kShortMaxSeq scores
    const C* kh = hist;
    const C* vh = hist + (size_t)pos * d;
    float a = 0.f, b = 0.f, v = 0.f;
    if (tid < d) {
        a = q3t_ld_act(qkv + (size_t)h * d + tid);
        b = q3t_ld_act(qkv + (size_t)(hq + kvh) * d + tid);
        v = round_to<C>(q3t_ld_act(qkv + (size_t)(hq + hkv + kvh) * d + tid));
    }
    norm_rope_head<C>(a, b, v, k, eps, d, pos, kvh, hkv, h % group == 0, kc, vc, qs, ks, vs, red);
    short_attend(
        qs, pos, d, scale, [&](int t, int i) { return t == pos ? ks[i] : Elem<C>::load(kh + (size_t)t * d, i); },
        [&](int t, int i) { return t == pos ? vs[i] : Elem<C>::load(vh + (size_t)t * d, i); }, sc, out + (size_t)h * d);
}

// Positions 0..n-1 of an empty short cache at once (the CodePredictor's first two positions, whose
// projections go through their GEMVs together), as block (h, p) of a kernel: it norms and rotates
// head h's q at position p and its group's k at positions 0..p from qkv [n, (hq + 2 hkv) d] itself
// (the cache does not hold them yet: the group's first head appends them in this launch), then
// attends over them through short_attend, as short_head does: the same bits as q3t_rope_attention at
// each position in turn. Shared memory: short_first_smem_bytes(d, n) of it dynamic.
__host__ __device__ constexpr size_t short_first_smem_bytes(int d, int n) {
    return (size_t)(3 * d + 2 * n * d + kShortMaxSeq) * sizeof(float);
}
template <typename C>
__device__ __forceinline__ void rope_attention_first_block(
    const float* __restrict__ qkv, const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, int n, int hq, int hkv, int d, float scale,
    C* k_cache, C* v_cache, float* __restrict__ out, int h, int p) {
    extern __shared__ float4 sm4[];  // 3 d (norm_rope_head's q, k, v), n d keys, n d values, kShortMaxSeq scores
    __shared__ float red[32];
    float* qs = reinterpret_cast<float*>(sm4);
    float* ks = qs + d;
    float* vs = qs + 2 * d;
    float* keys = qs + 3 * d;
    float* vals = keys + (size_t)n * d;
    float* sc = vals + (size_t)n * d;
    const int group = hq / hkv, kvh = h / group;
    const int tid = threadIdx.x;
    const size_t row = (size_t)(hq + 2 * hkv) * d;
    q3t_grid_dep_trigger_first();
    // All rows' k and v as they come (one round trip), then each position's norms and RoPE.
    const float a = tid < d ? qkv[p * row + (size_t)h * d + tid] : 0.f;
    if (tid < d)
#pragma unroll 2
        for (int t = 0; t <= p; ++t) {
            keys[(size_t)t * d + tid] = qkv[t * row + (size_t)(hq + kvh) * d + tid];
            vals[(size_t)t * d + tid] = round_to<C>(qkv[t * row + (size_t)(hq + hkv + kvh) * d + tid]);
        }
    for (int t = 0; t <= p; ++t) {  // ends with qs = q of position p
        const ShortConsts c = short_head_consts(qn, kn, cos_tab, sin_tab, t, d);
        // Each thread reads back only its own elements: no barrier needed before norm_rope_head.
        const float b = tid < d ? keys[(size_t)t * d + tid] : 0.f, v = tid < d ? vals[(size_t)t * d + tid] : 0.f;
        norm_rope_head<C>(t == p ? a : 0.f, b, v, c, eps, d, t, kvh, hkv, t == p && h % group == 0, k_cache, v_cache, qs,
                          ks, vs, red);
        if (tid < d) {
            keys[(size_t)t * d + tid] = ks[tid];
            vals[(size_t)t * d + tid] = vs[tid];
        }
    }
    __syncthreads();
    short_attend(
        qs, p, d, scale, [&](int t, int i) { return keys[(size_t)t * d + i]; },
        [&](int t, int i) { return vals[(size_t)t * d + i]; }, sc, out + (size_t)p * hq * d + (size_t)h * d);
}
