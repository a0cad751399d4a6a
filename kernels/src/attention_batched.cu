// The attention of a batched decode step: each row (stream) of the step runs the single-stream
// kernels' block code (attention_split.cuh, attention_short.cuh) on its own K/V cache, position and
// slices of the work buffers, the row in blockIdx.z (Talker) or blockIdx.y / .z (CodePredictor).
// Nothing is shared between rows, so each row's cache rows and outputs are those of the
// one-stream kernel on that row's data, bit for bit, whatever the other rows hold.
#include "common.cuh"
#include "attention_split.cuh"

namespace {

// The cache of slot (or row) s: `stride` cache rows (of hkv d elements) past slot 0's.
template <typename C>
__device__ __forceinline__ C* slot_cache(void* base, int s, int stride, int hkv, int d) {
    return static_cast<C*>(base) + (size_t)s * stride * hkv * d;
}

// The Talker's norm + RoPE + append + split attention for row blockIdx.z: its stream's slot, and
// that slot's cache (slot_rows cache rows apart) and position; scratch and counters per row.
template <typename C>
__global__ void __launch_bounds__(kThreads) k_batched_rope_attn_split(
    const float* __restrict__ qkv, const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, const int* __restrict__ slot,
    const int* __restrict__ positions, int hq, int hkv, int d, int max_seq, float scale, int splits, int hist_rows,
    void* k_cache, void* v_cache, int slot_rows, float* __restrict__ scratch, float* __restrict__ out) {
    const int r = blockIdx.z;
    // The slot table is set before the step's graph runs; the position by the previous step's
    // q3t_batched_advance, which a GEMV follows (the rule of q3t_grid_dep in common.cuh).
    const int s = slot[r];
    if (s < 0) return;  // a padding row
    int pos = positions[s];
    pos = pos < 0 ? 0 : (pos >= max_seq ? max_seq - 1 : pos);
    const size_t row_scratch = (size_t)hq * splits * (d + 2) + hq;  // partials, then the merge counters
    rope_attn_split_block<C>(qkv + (size_t)r * (hq + 2 * hkv) * d, qn, kn, eps, cos_tab, sin_tab, pos, hq, hkv, d,
                             scale, splits, hist_rows, slot_cache<C>(k_cache, s, slot_rows, hkv, d),
                             slot_cache<C>(v_cache, s, slot_rows, hkv, d), scratch + r * row_scratch,
                             out + (size_t)r * hq * d, blockIdx.x, blockIdx.y);
}

// The CodePredictor's norm + RoPE + append + attention at one position (the same for every row),
// for row blockIdx.y on its own short cache (row_rows cache rows apart).
template <typename C>
__global__ void __launch_bounds__(kShortThreads) k_batched_rope_attention(
    const float* __restrict__ qkv, const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, const int* __restrict__ pos_ptr, int pos_add,
    int hq, int hkv, int d, int max_seq, float scale, void* k_cache, void* v_cache, int row_rows,
    float* __restrict__ out) {
    extern __shared__ float4 sm4[];  // short_smem_bytes<C>(d, max_seq)
    __shared__ float red[32];
    float* sm = reinterpret_cast<float*>(sm4);
    C* hist = reinterpret_cast<C*>(sm + 3 * d + kShortMaxSeq);
    const int h = blockIdx.x, r = blockIdx.y;
    C* kc = slot_cache<C>(k_cache, r, row_rows, hkv, d);
    C* vc = slot_cache<C>(v_cache, r, row_rows, hkv, d);
    // Before the wait, as q3t_rope_attention: the position, the earlier positions' K/V rows and
    // the head's constants, none written by the kernel before.
    int pos = read_pos(pos_ptr, pos_add);
    pos = pos < 0 ? 0 : (pos >= max_seq ? max_seq - 1 : pos);
    short_history<C>(kc, vc, pos, h / (hq / hkv), hkv, d, hist);
    const ShortConsts k = short_head_consts(qn, kn, cos_tab, sin_tab, pos, d);
    q3t_grid_dep_trigger_first();
    short_head<C>(qkv + (size_t)r * (hq + 2 * hkv) * d, k, eps, pos, h, hq, hkv, d, scale, kc, vc, hist,
                  out + (size_t)r * hq * d, sm, red);
}

// Positions 0..n-1 of each row's empty short cache, block (h, p, row).
template <typename C>
__global__ void __launch_bounds__(kShortThreads) k_batched_rope_attention_first(
    const float* __restrict__ qkv, const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, int n, int hq, int hkv, int d, float scale,
    void* k_cache, void* v_cache, int row_rows, float* __restrict__ out) {
    const int r = blockIdx.z;
    rope_attention_first_block<C>(qkv + (size_t)r * n * (hq + 2 * hkv) * d, qn, kn, eps, cos_tab, sin_tab, n, hq, hkv,
                                  d, scale, slot_cache<C>(k_cache, r, row_rows, hkv, d),
                                  slot_cache<C>(v_cache, r, row_rows, hkv, d), out + (size_t)r * n * hq * d, blockIdx.x,
                                  blockIdx.y);
}

bool batch_ok(int nb) { return nb >= 1 && nb <= Q3T_BATCH_MAX; }

}  // namespace

extern "C" Q3T_API int q3t_batched_rope_attention_split(int dtype, const float* qkv, const float* q_norm_w,
                                                        const float* k_norm_w, float eps, const float* cos_tab,
                                                        const float* sin_tab, const int* slot, const int* pos, int nb,
                                                        int hq, int hkv, int d, int max_seq, float scale, int splits,
                                                        float* scratch, void* k_cache, void* v_cache, int slot_rows,
                                                        float* out, void* stream) {
    if (!qkv || !q_norm_w || !k_norm_w || !cos_tab || !sin_tab || !slot || !pos || !k_cache || !v_cache || !out ||
        (splits > 1 && !scratch))
        return q3t_fail("q3t_batched_rope_attention_split: null pointer");
    if (!batch_ok(nb) || hq <= 0 || hkv <= 0 || hq % hkv || d <= 0 || d > kMaxD || d % 2 || splits <= 0 ||
        splits > 1024 || max_seq <= 0 || slot_rows < max_seq)
        return q3t_fail("q3t_batched_rope_attention_split: bad shape nb=%d hq=%d hkv=%d d=%d splits=%d slot_rows=%d", nb,
                        hq, hkv, d, splits, slot_rows);
    const dim3 grid(hq, splits, nb);
    const size_t smem = split_smem_bytes(dtype, d);
    cudaStream_t s = Q3T_STREAM(stream);
    if (dtype == Q3T_F32)
        q3t_launch(k_batched_rope_attn_split<float>, grid, kThreads, smem, s, qkv, q_norm_w, k_norm_w, eps, cos_tab,
                   sin_tab, slot, pos, hq, hkv, d, max_seq, scale, splits, split_hist_rows(d), k_cache, v_cache,
                   slot_rows, scratch, out);
    else if (dtype == Q3T_BF16)
        q3t_launch(k_batched_rope_attn_split<uint16_t>, grid, kThreads, smem, s, qkv, q_norm_w, k_norm_w, eps, cos_tab,
                   sin_tab, slot, pos, hq, hkv, d, max_seq, scale, splits, split_hist_rows(d), k_cache, v_cache,
                   slot_rows, scratch, out);
    else
        return q3t_fail("q3t_batched_rope_attention_split: unknown dtype %d", dtype);
    return q3t_check_launch("q3t_batched_rope_attention_split");
}

extern "C" Q3T_API int q3t_batched_rope_attention(int dtype, const float* qkv, const float* q_norm_w,
                                                  const float* k_norm_w, float eps, const float* cos_tab,
                                                  const float* sin_tab, const int* pos_ptr, int pos_add, int nb, int hq,
                                                  int hkv, int d, int max_seq, float scale, void* k_cache,
                                                  void* v_cache, int row_rows, float* out, void* stream) {
    if (!qkv || !q_norm_w || !k_norm_w || !cos_tab || !sin_tab || !k_cache || !v_cache || !out)
        return q3t_fail("q3t_batched_rope_attention: null pointer");
    if (!batch_ok(nb) || !short_shape_ok(hq, hkv, d, max_seq) || row_rows < max_seq)
        return q3t_fail("q3t_batched_rope_attention: bad shape nb=%d hq=%d hkv=%d d=%d max_seq=%d row_rows=%d (d <= %d, "
                        "max_seq <= %d, max_seq * d <= %d)", nb, hq, hkv, d, max_seq, row_rows, kShortThreads,
                        kShortMaxSeq, kShortMaxElems);
    const dim3 grid(hq, nb);
    cudaStream_t s = Q3T_STREAM(stream);
    if (dtype == Q3T_F32)
        q3t_launch(k_batched_rope_attention<float>, grid, kShortThreads, short_smem_bytes<float>(d, max_seq), s, qkv,
                   q_norm_w, k_norm_w, eps, cos_tab, sin_tab, pos_ptr, pos_add, hq, hkv, d, max_seq, scale, k_cache,
                   v_cache, row_rows, out);
    else if (dtype == Q3T_BF16)
        q3t_launch(k_batched_rope_attention<uint16_t>, grid, kShortThreads, short_smem_bytes<uint16_t>(d, max_seq), s,
                   qkv, q_norm_w, k_norm_w, eps, cos_tab, sin_tab, pos_ptr, pos_add, hq, hkv, d, max_seq, scale, k_cache,
                   v_cache, row_rows, out);
    else
        return q3t_fail("q3t_batched_rope_attention: unknown dtype %d", dtype);
    return q3t_check_launch("q3t_batched_rope_attention");
}

extern "C" Q3T_API int q3t_batched_rope_attention_first(int dtype, const float* qkv, const float* q_norm_w,
                                                        const float* k_norm_w, float eps, const float* cos_tab,
                                                        const float* sin_tab, int n, int nb, int hq, int hkv, int d,
                                                        int max_seq, float scale, void* k_cache, void* v_cache,
                                                        int row_rows, float* out, void* stream) {
    if (!qkv || !q_norm_w || !k_norm_w || !cos_tab || !sin_tab || !k_cache || !v_cache || !out)
        return q3t_fail("q3t_batched_rope_attention_first: null pointer");
    if (!batch_ok(nb) || !short_shape_ok(hq, hkv, d, max_seq) || n <= 0 || n > max_seq || row_rows < max_seq)
        return q3t_fail("q3t_batched_rope_attention_first: bad shape n=%d nb=%d hq=%d hkv=%d d=%d max_seq=%d row_rows=%d "
                        "(n <= max_seq, d <= %d, max_seq <= %d, max_seq * d <= %d)", n, nb, hq, hkv, d, max_seq,
                        row_rows, kShortThreads, kShortMaxSeq, kShortMaxElems);
    const dim3 grid(hq, n, nb);
    const size_t smem = short_first_smem_bytes(d, n);
    cudaStream_t s = Q3T_STREAM(stream);
    if (dtype == Q3T_F32)
        q3t_launch(k_batched_rope_attention_first<float>, grid, kShortThreads, smem, s, qkv, q_norm_w, k_norm_w, eps,
                   cos_tab, sin_tab, n, hq, hkv, d, scale, k_cache, v_cache, row_rows, out);
    else if (dtype == Q3T_BF16)
        q3t_launch(k_batched_rope_attention_first<uint16_t>, grid, kShortThreads, smem, s, qkv, q_norm_w, k_norm_w, eps,
                   cos_tab, sin_tab, n, hq, hkv, d, scale, k_cache, v_cache, row_rows, out);
    else
        return q3t_fail("q3t_batched_rope_attention_first: unknown dtype %d", dtype);
    return q3t_check_launch("q3t_batched_rope_attention_first");
}
