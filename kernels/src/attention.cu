// GQA decode attention of one query position over the static KV cache (flash-decoding), fused with
// the q/k RMSNorm, RoPE and KV append before it. The Talker's long context (q3t_rope_attention_split):
// the context is cut into up to `splits` chunks of at least kMinChunk positions, one block per
// (q head, chunk) keeps an online softmax per warp, and the last block of each head to finish merges
// the chunks (the block code is in attention_split.cuh, shared with the batched step). Softmax
// statistics and accumulation are float32. Below it, the short-context kernels of the CodePredictor
// (attention_short.cuh).
#include "common.cuh"
#include "attention_split.cuh"  // the split-attention block code (and attention_short.cuh)

namespace {
// q3t_rope_attention_split: one block per (q head, chunk), rope_attn_split_block each.
template <typename C>
__global__ void __launch_bounds__(kThreads) k_rope_attn_partial(
    const float* __restrict__ qkv, const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, const int* __restrict__ pos_ptr, int pos_add,
    int hq, int hkv, int d, int max_seq, float scale, int splits, int hist_rows, C* kc, C* vc,
    float* __restrict__ scratch, float* __restrict__ out) {
    int pos = read_pos(pos_ptr, pos_add);  // set by a kernel of the previous frame, long finished
    pos = pos < 0 ? 0 : (pos >= max_seq ? max_seq - 1 : pos);
    rope_attn_split_block<C>(qkv, qn, kn, eps, cos_tab, sin_tab, pos, hq, hkv, d, scale, splits, hist_rows, kc, vc,
                             scratch, out, blockIdx.x, blockIdx.y);
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
    const int hist_rows = split_hist_rows(d);
    const size_t smem = split_smem_bytes(dtype, d);
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
    return q3t_check_launch("q3t_rope_attention_split");  // merged in the pass (merge_if_last)
}

// ---------------------------------------------------------------------------------------------
// Short contexts (the CodePredictor's 16 positions): q/k RMSNorm + RoPE + KV append + attention
// in one kernel, one block per q head (attention_short.cuh).

namespace {
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

// q3t_rope_attention_first: block (h, p) per q head and position, rope_attention_first_block each.
template <typename C>
__global__ void __launch_bounds__(kShortThreads) k_rope_attention_first(
    const float* __restrict__ qkv, const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, int n, int hq, int hkv, int d, float scale,
    C* k_cache, C* v_cache, float* __restrict__ out) {
    rope_attention_first_block<C>(qkv, qn, kn, eps, cos_tab, sin_tab, n, hq, hkv, d, scale, k_cache, v_cache, out,
                                  blockIdx.x, blockIdx.y);
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
    const size_t smem = short_first_smem_bytes(d, n);
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
