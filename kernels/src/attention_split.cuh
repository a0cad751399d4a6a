// Decode attention of one query over a long KV cache (flash-decoding) as block-level device code:
// the context is cut into up to `splits` chunks (of at least kMinChunk positions), one block
// per (q head, chunk) keeps an online softmax per warp (one key per warp per step, lanes over head
// dims), then the last block of each head to finish merges the chunks.
// The one-stream Talker attention (attention.cu); chunk_len and the block's limits also serve the
// batched step's grouped attention (attention_batched.cu).
// Softmax statistics and accumulation are float32.
#pragma once

#include "common.cuh"
#include "attention_short.cuh"  // round_to, copy_kv_rows, ShortConsts, norm_rope_head

namespace {
constexpr int kThreads = 256;  // 8 warps: a 16-key CodePredictor context takes two steps per warp
constexpr int kMaxD = 256;

// Earlier K/V rows a split block holds in shared memory: up to 4096 elements each of K and V (32 KiB
// in float32 with the block's 11 KiB of static arrays stays under the 48 KiB launch limit).
inline int split_hist_rows(int d) { return 4096 / d < 64 ? 4096 / d : 64; }
inline size_t split_smem_bytes(int dtype, int d) {
    return (size_t)2 * split_hist_rows(d) * d * (dtype == Q3T_F32 ? sizeof(float) : sizeof(uint16_t));
}

constexpr int kMinChunk = 16;

// Positions per chunk for a context of len positions cut into at most `splits` chunks: len / splits
// rounded up, but at least kMinChunk, so a short context takes fewer (fuller) chunks. Each block
// of a split pass has a fixed cost; on the H200 about 16 positions per chunk was best both at ~130
// positions of context (8 chunks over 16: 1.7B -0.045 ms per frame) and at ~530 (32 over 16: 0.6B
// -0.05 ms), so the pass launches up to `splits` blocks per head and those past the context return.
__device__ __forceinline__ int chunk_len(int len, int splits) {
    return max((len + splits - 1) / splits, kMinChunk);
}

// One key of the online softmax (per warp): its score sc and its value row (value(i), dimension i)
// folded into the running max m, sum l and accumulator acc (lanes over head dimensions).
template <int kPer, typename Value>
__device__ __forceinline__ void online_softmax_step(float sc, Value value, int d, float& m, float& l,
                                                    float (&acc)[kPer]) {
    const int lane = threadIdx.x % Q3T_WARP;
    const float m_new = fmaxf(m, sc);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(sc - m_new);
    l = l * corr + p;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int i = lane + j * Q3T_WARP;
        if (i < d) acc[j] = acc[j] * corr + p * value(i);
    }
    m = m_new;
}

// The end of a partial block: its warps' (max, sum, accumulator) merged into one, written to
// scratch (or, with one chunk, the normalised result to direct).
template <int kPer>
__device__ __forceinline__ void partial_out(float m, float l, const float (&acc)[kPer], int h, int split, int d,
                                            int splits, float* sm_m, float* sm_l, float (*sm_acc)[kMaxD],
                                            float* __restrict__ scratch, float* __restrict__ direct) {
    const int lane = threadIdx.x % Q3T_WARP, warp = threadIdx.x / Q3T_WARP, nwarps = blockDim.x / Q3T_WARP;
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int i = lane + j * Q3T_WARP;
        if (i < d) sm_acc[warp][i] = acc[j];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < nwarps; ++w) M = fmaxf(M, sm_m[w]);
    if (direct) {  // one chunk: this block has the whole softmax, write the result (no merge pass)
        float L = 0.f;
        for (int w = 0; w < nwarps; ++w) L += sm_m[w] == -INFINITY ? 0.f : sm_l[w] * expf(sm_m[w] - M);
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float a = 0.f;
            for (int w = 0; w < nwarps; ++w)
                if (sm_m[w] != -INFINITY) a += sm_acc[w][i] * expf(sm_m[w] - M);
            direct[(size_t)h * d + i] = a / L;
        }
        return;
    }
    float* out = scratch + ((size_t)h * splits + split) * (d + 2);
    if (M == -INFINITY) {  // empty chunk
        if (threadIdx.x == 0) {
            out[0] = -INFINITY;
            out[1] = 0.f;
        }
        for (int i = threadIdx.x; i < d; i += blockDim.x) out[2 + i] = 0.f;
        return;
    }
    float L = 0.f;
    for (int w = 0; w < nwarps; ++w) L += sm_m[w] == -INFINITY ? 0.f : sm_l[w] * expf(sm_m[w] - M);
    if (threadIdx.x == 0) {
        out[0] = M;
        out[1] = L;
    }
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float a = 0.f;
        for (int w = 0; w < nwarps; ++w)
            if (sm_m[w] != -INFINITY) a += sm_acc[w][i] * expf(sm_m[w] - M);
        out[2 + i] = a;
    }
}

// Heads h0 .. h0 + heads - 1: each one's first n chunks' (max, sum, accumulator) from scratch (laid out for
// `splits` chunks per head) into its normalised output, a thread per (head, dim). Read at L2: in the split
// pass's last block the partials come from other blocks of the same kernel.
__device__ void merge_heads(const float* scratch, int h0, int heads, int d, int splits, int n,
                            float* __restrict__ out) {
    for (int e = threadIdx.x; e < heads * d; e += blockDim.x) {
        const int h = h0 + e / d, i = e % d;
        const float* base = scratch + (size_t)h * splits * (d + 2);
        float M = -INFINITY;
        for (int s = 0; s < n; ++s) M = fmaxf(M, q3t_ld_act(base + (size_t)s * (d + 2)));
        float L = 0.f, a = 0.f;
        for (int s = 0; s < n; ++s) {
            const float ms = q3t_ld_act(base + (size_t)s * (d + 2));
            if (ms == -INFINITY) continue;  // an empty chunk
            const float w = expf(ms - M);
            L += q3t_ld_act(base + (size_t)s * (d + 2) + 1) * w;
            a += q3t_ld_act(base + (size_t)s * (d + 2) + 2 + i) * w;
        }
        out[(size_t)h * d + i] = a / L;
    }
}

// After a block of the split pass has written its chunks' partials of heads h0 .. h0 + heads - 1: the last
// of the blocks sharing `counter` to finish (it resets the counter for the next launch) merges those heads,
// so no second kernel runs. The fences order each block's partial before its count, and the count before
// the last block's reads (the CUDA programming guide's threadFenceReduction pattern).
// n: the blocks that run for these heads (chunks within the context).
__device__ __forceinline__ void merge_if_last(const float* scratch, int* counter, int h0, int heads, int d,
                                              int splits, int n, float* __restrict__ out) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1) == n - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    merge_heads(scratch, h0, heads, d, splits, n, out);
    if (threadIdx.x == 0) *counter = 0;
}

// The q/k RMSNorm, RoPE, KV append and the chunk's online softmax as one block (head h, chunk `split`) of a kernel: the
// Talker's long context of one stream (q3t_rope_attention_split). Before the PDL wait the block copies the earlier positions'
// K/V rows of its chunk (up to hist_rows of them) into shared memory and loads the head's
// constants; after it, it norms and rotates its head's q (and, in the chunk that holds pos, the
// group's k and v, which the first q head of the group appends to the cache) and runs the online
// softmax over the chunk. pos (already clamped to the cache) was set by a kernel of an earlier
// frame, long finished. scratch: hq * splits * (d + 2) floats, then hq int32 counters (zero).
template <typename C>
__device__ __forceinline__ void rope_attn_split_block(
    const float* __restrict__ qkv, const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, int pos, int hq, int hkv, int d,
    float scale, int splits, int hist_rows, C* kc, C* vc, float* __restrict__ scratch, float* __restrict__ out, int h,
    int split) {
    constexpr int kPer = kMaxD / Q3T_WARP;  // head dims per lane, upper bound
    extern __shared__ float4 hist4[];      // 2 hist_rows d cache elements: K rows, then V rows
    __shared__ float sm_m[kThreads / 32], sm_l[kThreads / 32];
    __shared__ float sm_acc[kThreads / 32][kMaxD];
    __shared__ float qs[kMaxD], ks[kMaxD], vs[kMaxD];
    __shared__ float red[32];
    const int group = hq / hkv, kvh = h / group;
    const int tid = threadIdx.x, lane = tid % Q3T_WARP, warp = tid / Q3T_WARP, nwarps = blockDim.x / Q3T_WARP;
    const int len = pos + 1;
    const int chunk = chunk_len(len, splits);
    const int n_chunks = (len + chunk - 1) / chunk;
    if (split >= n_chunks) return;  // past the context (the last-block merge counts the n_chunks that run)
    float* direct = n_chunks == 1 ? out : nullptr;  // one chunk: the block writes the result itself
    const int begin = split * chunk, end = min(len, begin + chunk);
    const bool has_pos = begin <= pos && pos < end;
    // Earlier positions of the chunk: written by earlier frames' kernels, not by the one before.
    C* kh = reinterpret_cast<C*>(hist4);
    C* vh = kh + (size_t)hist_rows * d;
    const int n_pre = max(0, min(min(end, pos) - begin, hist_rows));
    copy_kv_rows<C>(kc, vc, begin, n_pre, kvh, hkv, d, kh, vh);
    const ShortConsts k = short_head_consts(qn, kn, cos_tab, sin_tab, pos, d);
    q3t_grid_dep_trigger_first();

    // q of head h (and k, v of its group where the chunk holds pos): RMSNorm, RoPE, append.
    float a = 0.f, b = 0.f, v = 0.f;
    if (tid < d) {
        a = qkv[(size_t)h * d + tid];
        if (has_pos) {
            b = qkv[(size_t)(hq + kvh) * d + tid];
            v = round_to<C>(qkv[(size_t)(hq + hkv + kvh) * d + tid]);
        }
    }
    norm_rope_head<C>(a, b, v, k, eps, d, pos, kvh, hkv, has_pos && h % group == 0, kc, vc, qs, ks, vs, red);

    float qr[kPer], acc[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int i = lane + j * Q3T_WARP;
        qr[j] = i < d ? qs[i] : 0.f;
        acc[j] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int t = begin + warp; t < end; t += nwarps) {
        const int r = t - begin;
        const C* krow = r < n_pre ? kh + (size_t)r * d : kc + ((size_t)t * hkv + kvh) * d;
        const C* vrow = r < n_pre ? vh + (size_t)r * d : vc + ((size_t)t * hkv + kvh) * d;
        float sc = 0.f;
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            const int i = lane + j * Q3T_WARP;
            if (i < d) sc += qr[j] * (t == pos ? ks[i] : Elem<C>::load(krow, i));
        }
        sc = warp_sum(sc) * scale;
        online_softmax_step(sc, [&](int i) { return t == pos ? vs[i] : Elem<C>::load(vrow, i); }, d, m, l, acc);
    }
    partial_out(m, l, acc, h, split, d, splits, sm_m, sm_l, sm_acc, scratch, direct);
    if (!direct)
        merge_if_last(scratch, reinterpret_cast<int*>(scratch + (size_t)hq * splits * (d + 2)) + h, h, 1, d, splits,
                      n_chunks, out);
}
}  // namespace
