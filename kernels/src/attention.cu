// GQA decode attention of one query position over the static KV cache (flash-decoding), fused with
// the q/k RMSNorm, RoPE and KV append before it. The Talker's long context (q3t_rope_attention_split):
// the context is cut into up to `splits` chunks of at least kMinChunk positions, one block per
// (q head, chunk) keeps an online softmax per warp (one key per warp per step, lanes over head dims),
// and the last block of each head to finish merges the chunks. Softmax statistics and accumulation are
// float32. Below it, the short-context kernels of the CodePredictor (attention_short.cuh).
#include "common.cuh"
#include "attention_short.cuh"  // round_to, and the short-context kernel below

namespace {
constexpr int kThreads = 256;  // 8 warps: a 16-key CodePredictor context takes two steps per warp
constexpr int kMaxD = 256;

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


// Head h's first n chunks' (max, sum, accumulator) from scratch (laid out for `splits` chunks per
// head) into its normalised output, block-wide. Read at L2: in the split pass's last block the
// partials come from other blocks of the same kernel.
__device__ void merge_head(const float* scratch, int h, int d, int splits, int n, float* __restrict__ out) {
    const float* base = scratch + (size_t)h * splits * (d + 2);
    float M = -INFINITY;
    for (int s = 0; s < n; ++s) M = fmaxf(M, q3t_ld_act(base + (size_t)s * (d + 2)));
    float L = 0.f;
    for (int s = 0; s < n; ++s) {
        const float ms = q3t_ld_act(base + (size_t)s * (d + 2));
        if (ms != -INFINITY) L += q3t_ld_act(base + (size_t)s * (d + 2) + 1) * expf(ms - M);
    }
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float a = 0.f;
        for (int s = 0; s < n; ++s) {
            const float ms = q3t_ld_act(base + (size_t)s * (d + 2));
            if (ms != -INFINITY) a += q3t_ld_act(base + (size_t)s * (d + 2) + 2 + i) * expf(ms - M);
        }
        out[(size_t)h * d + i] = a / L;
    }
}

// After a block of the split pass has written its chunk's partial: the last of head h's blocks to
// finish (counted in counters[h], which it resets for the next launch) merges the head, so no
// second kernel runs. The fences order each block's partial before its count, and the count before
// the last block's reads (the CUDA programming guide's threadFenceReduction pattern).
// n: the head's blocks that run (chunks within the context).
__device__ __forceinline__ void merge_if_last(const float* scratch, int* counters, int h, int d, int splits, int n,
                                              float* __restrict__ out) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counters + h, 1) == n - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    merge_head(scratch, h, d, splits, n, out);
    if (threadIdx.x == 0) counters[h] = 0;
}

// The Talker's attention step: before the PDL wait each block copies the earlier positions' K/V
// rows of its chunk (up to hist_rows of them) into shared memory and loads the head's constants;
// after it, it norms and rotates its head's q (and, in the chunk that holds pos, the group's k and
// v, which the first q head of the group appends to the cache) and runs the online softmax over
// the chunk.
template <typename C>
__global__ void __launch_bounds__(kThreads) k_rope_attn_partial(
    const float* __restrict__ qkv, const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, const int* __restrict__ pos_ptr, int pos_add,
    int hq, int hkv, int d, int max_seq, float scale, int splits, int hist_rows, C* kc, C* vc,
    float* __restrict__ scratch, float* __restrict__ out) {
    constexpr int kPer = kMaxD / Q3T_WARP;  // head dims per lane, upper bound
    extern __shared__ float4 hist4[];      // 2 hist_rows d cache elements: K rows, then V rows
    __shared__ float sm_m[kThreads / 32], sm_l[kThreads / 32];
    __shared__ float sm_acc[kThreads / 32][kMaxD];
    __shared__ float qs[kMaxD], ks[kMaxD], vs[kMaxD];
    __shared__ float red[32];
    const int h = blockIdx.x, split = blockIdx.y;
    const int group = hq / hkv, kvh = h / group;
    const int tid = threadIdx.x, lane = tid % Q3T_WARP, warp = tid / Q3T_WARP, nwarps = blockDim.x / Q3T_WARP;
    int pos = read_pos(pos_ptr, pos_add);  // set by a kernel of the previous frame, long finished
    pos = pos < 0 ? 0 : (pos >= max_seq ? max_seq - 1 : pos);
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
        merge_if_last(scratch, reinterpret_cast<int*>(scratch + (size_t)hq * splits * (d + 2)), h, d, splits, n_chunks,
                      out);
}
}  // namespace

extern "C" Q3T_API int q3t_rope_attention_split(int dtype, const float* qkv, const float* q_norm_w,
                                                const float* k_norm_w, float eps, const float* cos_tab,
                                                const float* sin_tab, const int* pos_ptr, int pos_add, int hq, int hkv,
                                                int d, int max_seq, float scale, int splits, float* scratch,
                                                void* k_cache, void* v_cache, float* out, void* stream) {
    if (!qkv || !q_norm_w || !k_norm_w || !cos_tab || !sin_tab || !k_cache || !v_cache || !out ||
        (splits > 1 && !scratch))
        return q3t_fail("q3t_rope_attention_split: null pointer");
    if (hq <= 0 || hkv <= 0 || hq % hkv || d <= 0 || d > kMaxD || d % 2 || splits <= 0 || splits > 1024 ||
        max_seq <= 0)
        return q3t_fail("q3t_rope_attention_split: bad shape hq=%d hkv=%d d=%d splits=%d", hq, hkv, d, splits);
    cudaStream_t s = Q3T_STREAM(stream);
    const dim3 grid(hq, splits);
    // Earlier rows held in shared memory per block: up to 4096 elements each of K and V (32 KiB in
    // float32 with the kernel's 11 KiB of static arrays stays under the 48 KiB launch limit).
    const int hist_rows = 4096 / d < 64 ? 4096 / d : 64;
    const size_t smem = (size_t)2 * hist_rows * d * (dtype == Q3T_F32 ? sizeof(float) : sizeof(uint16_t));
    if (dtype == Q3T_F32)
        q3t_launch(k_rope_attn_partial<float>, grid, kThreads, smem, s, qkv, q_norm_w, k_norm_w, eps, cos_tab, sin_tab,
                   pos_ptr, pos_add, hq, hkv, d, max_seq, scale, splits, hist_rows, static_cast<float*>(k_cache),
                   static_cast<float*>(v_cache), scratch, out);
    else if (dtype == Q3T_BF16)
        q3t_launch(k_rope_attn_partial<uint16_t>, grid, kThreads, smem, s, qkv, q_norm_w, k_norm_w, eps, cos_tab,
                   sin_tab, pos_ptr, pos_add, hq, hkv, d, max_seq, scale, splits, hist_rows,
                   static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache), scratch, out);
    else
        return q3t_fail("q3t_rope_attention_split: unknown dtype %d", dtype);
    return q3t_check_launch("q3t_rope_attention_split");
}

// ---------------------------------------------------------------------------------------------
// Short contexts (the CodePredictor's 16 positions): q/k RMSNorm + RoPE + KV append + attention
// in one kernel, one block per q head (attention_short.cuh).

namespace {
constexpr int kShortThreads = 256;

// The shapes the short-context kernels take (their K/V history and scores live in shared memory).
bool short_shape_ok(int hq, int hkv, int d, int max_seq) {
    return hq > 0 && hkv > 0 && hq % hkv == 0 && d > 0 && d <= kShortThreads && d % 2 == 0 && max_seq > 0 &&
           max_seq <= kShortMaxSeq && max_seq * d <= kShortMaxElems;
}

template <typename C>
__global__ void __launch_bounds__(kShortThreads) k_rope_attention(
    const float* __restrict__ qkv, const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, const int* __restrict__ pos_ptr, int pos_add,
    int hq, int hkv, int d, int max_seq, float scale, C* k_cache, C* v_cache, float* __restrict__ out) {
    extern __shared__ float4 sm4[];  // short_smem_bytes<C>(d, max_seq)
    __shared__ float red[32];
    float* sm = reinterpret_cast<float*>(sm4);
    C* hist = reinterpret_cast<C*>(sm + 3 * d + kShortMaxSeq);
    // Before the wait: the position (a frame counter or a constant, set long before), the K/V
    // rows of earlier positions and the head's constants; none is written by the kernel before.
    int pos = read_pos(pos_ptr, pos_add);
    pos = pos < 0 ? 0 : (pos >= max_seq ? max_seq - 1 : pos);  // never outside the cache
    const int h = blockIdx.x;
    short_history<C>(k_cache, v_cache, pos, h / (hq / hkv), hkv, d, hist);
    const ShortConsts k = short_head_consts(qn, kn, cos_tab, sin_tab, pos, d);
    q3t_grid_dep_trigger_first();
    short_head<C>(qkv, k, eps, pos, h, hq, hkv, d, scale, k_cache, v_cache, hist, out, sm, red);
}

// Positions 0..n-1 of an empty short cache at once (the CodePredictor's first two positions, whose
// projections q3t_gemv_batch computes together): block (h, p) norms and rotates head h's q at
// position p and its group's k at positions 0..p from qkv [n, (hq + 2 hkv) d] itself (the cache
// does not hold them yet: the group's first head appends them in this launch), then attends over
// them through short_attend, as short_head does: the same bits as q3t_rope_attention at each
// position in turn.
template <typename C>
__global__ void __launch_bounds__(kShortThreads) k_rope_attention_first(
    const float* __restrict__ qkv, const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, int n, int hq, int hkv, int d, float scale,
    C* k_cache, C* v_cache, float* __restrict__ out) {
    extern __shared__ float4 sm4[];  // 3 d (norm_rope_head's q, k, v), n d keys, n d values, kShortMaxSeq scores
    __shared__ float red[32];
    float* qs = reinterpret_cast<float*>(sm4);
    float* ks = qs + d;
    float* vs = qs + 2 * d;
    float* keys = qs + 3 * d;
    float* vals = keys + (size_t)n * d;
    float* sc = vals + (size_t)n * d;
    const int h = blockIdx.x, p = blockIdx.y, group = hq / hkv, kvh = h / group;
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
}  // namespace

extern "C" Q3T_API int q3t_rope_attention(int dtype, const float* qkv, const float* q_norm_w, const float* k_norm_w,
                                          float eps, const float* cos_tab, const float* sin_tab, const int* pos_ptr,
                                          int pos_add, int hq, int hkv, int d, int max_seq, float scale,
                                          void* k_cache, void* v_cache, float* out, void* stream) {
    if (!qkv || !q_norm_w || !k_norm_w || !cos_tab || !sin_tab || !k_cache || !v_cache || !out)
        return q3t_fail("q3t_rope_attention: null pointer");
    if (!short_shape_ok(hq, hkv, d, max_seq))
        return q3t_fail("q3t_rope_attention: bad shape hq=%d hkv=%d d=%d max_seq=%d (d <= %d, max_seq <= %d, "
                        "max_seq * d <= %d)", hq, hkv, d, max_seq, kShortThreads, kShortMaxSeq, kShortMaxElems);
    cudaStream_t s = Q3T_STREAM(stream);
    const size_t smem = dtype == Q3T_F32 ? short_smem_bytes<float>(d, max_seq) : short_smem_bytes<uint16_t>(d, max_seq);
    if (dtype == Q3T_F32)
        q3t_launch(k_rope_attention<float>, hq, kShortThreads, smem, s, qkv, q_norm_w, k_norm_w, eps, cos_tab, sin_tab,
                   pos_ptr, pos_add, hq, hkv, d, max_seq, scale, static_cast<float*>(k_cache),
                   static_cast<float*>(v_cache), out);
    else if (dtype == Q3T_BF16)
        q3t_launch(k_rope_attention<uint16_t>, hq, kShortThreads, smem, s, qkv, q_norm_w, k_norm_w, eps, cos_tab,
                   sin_tab, pos_ptr, pos_add, hq, hkv, d, max_seq, scale, static_cast<uint16_t*>(k_cache),
                   static_cast<uint16_t*>(v_cache), out);
    else
        return q3t_fail("q3t_rope_attention: unknown dtype %d", dtype);
    return q3t_check_launch("q3t_rope_attention");
}

extern "C" Q3T_API int q3t_rope_attention_first(int dtype, const float* qkv, const float* q_norm_w,
                                                const float* k_norm_w, float eps, const float* cos_tab,
                                                const float* sin_tab, int n, int hq, int hkv, int d, int max_seq,
                                                float scale, void* k_cache, void* v_cache, float* out, void* stream) {
    if (!qkv || !q_norm_w || !k_norm_w || !cos_tab || !sin_tab || !k_cache || !v_cache || !out)
        return q3t_fail("q3t_rope_attention_first: null pointer");
    if (!short_shape_ok(hq, hkv, d, max_seq) || n <= 0 || n > max_seq)
        return q3t_fail("q3t_rope_attention_first: bad shape n=%d hq=%d hkv=%d d=%d max_seq=%d (n <= max_seq, d <= %d, "
                        "max_seq <= %d, max_seq * d <= %d)", n, hq, hkv, d, max_seq, kShortThreads, kShortMaxSeq,
                        kShortMaxElems);
    cudaStream_t s = Q3T_STREAM(stream);
    const dim3 grid(hq, n);
    const size_t smem = (size_t)(3 * d + 2 * n * d + kShortMaxSeq) * sizeof(float);
    if (dtype == Q3T_F32)
        q3t_launch(k_rope_attention_first<float>, grid, kShortThreads, smem, s, qkv, q_norm_w, k_norm_w, eps, cos_tab,
                   sin_tab, n, hq, hkv, d, scale, static_cast<float*>(k_cache), static_cast<float*>(v_cache), out);
    else if (dtype == Q3T_BF16)
        q3t_launch(k_rope_attention_first<uint16_t>, grid, kShortThreads, smem, s, qkv, q_norm_w, k_norm_w, eps, cos_tab,
                   sin_tab, n, hq, hkv, d, scale, static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache), out);
    else
        return q3t_fail("q3t_rope_attention_first: unknown dtype %d", dtype);
    return q3t_check_launch("q3t_rope_attention_first");
}
