/* q3t: fused GPU kernels for the Qwen3-TTS decode loop (batch 1).
 *
 * One C ABI for both vendors (built by nvcc for CUDA or by hipcc for ROCm from the same
 * sources). Every launcher takes raw device pointers and a stream (cudaStream_t / hipStream_t
 * passed as void*), launches asynchronously, never synchronizes and never allocates, so a
 * whole frame can be captured into a CUDA/HIP graph by the caller and replayed.
 * Values that change from frame to frame (positions, step counters, sampled codes) are read
 * from device memory (the int32 pointers below), never passed by value, so one captured graph
 * stays valid for every frame.
 *
 * Activations, norm weights, biases and logits are float32. Matrix weights and the KV cache
 * are Q3T_F32 or Q3T_BF16 (the `dtype` argument); accumulation is float32.
 * Every function returns 0 on success or -1, after which q3t_last_error() describes it
 * (it carries the CUDA/HIP error string when the runtime reported one).
 *
 * Keep this file's prototypes one per line: tests/test_native_build.py parses them and
 * checks them against the ctypes declarations in wyoming_qwen3tts/native.py.
 */
#ifndef Q3T_H
#define Q3T_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define Q3T_API __declspec(dllexport)
#else
#define Q3T_API __attribute__((visibility("default")))
#endif

/* Bump on any change of a prototype, of a constant below or of a function's meaning. */
#define Q3T_ABI_VERSION 6

#define Q3T_F32 0
#define Q3T_BF16 1

/* q3t_gemv modes */
#define Q3T_GEMV_STORE 0    /* y[n] = dot(W[n], xn) (+ bias[n]) */
#define Q3T_GEMV_ADD 1      /* y[n] += dot(W[n], xn)  (residual add) */
#define Q3T_GEMV_SWIGLU 2   /* W rows interleaved gate/up: y[i] = silu(dot(W[2i], xn)) * dot(W[2i+1], xn); N = 2 * len(y) */

/* Logits-processing flags for q3t_sample */
#define Q3T_SAMPLE_DO_SAMPLE 1  /* else greedy argmax (lowest index among equal maxima) */

Q3T_API int q3t_abi_version(void);
Q3T_API const char* q3t_last_error(void);
Q3T_API int q3t_init(int device, int* warp_size, int* sm_count);

/* Launch with programmatic dependent launch (CUDA sm_90+ only; fails elsewhere when enable != 0).
 * Process-wide; takes effect for launches (and graph captures) made after the call. */
Q3T_API int q3t_set_pdl(int enable);

/* y = RMSNorm(x) * w over n elements (statistics in float32). */
Q3T_API int q3t_rmsnorm(const float* x, const float* w, float* y, int n, float eps, void* stream);

/* y (mode) W[N, K] @ xn, xn = norm_w ? RMSNorm(x) * norm_w : x. bias may be NULL. K <= 8192. */
Q3T_API int q3t_gemv(int dtype, const void* w, int n_rows, int k, const float* x, const float* norm_w, float eps, const float* bias, float* y, int mode, void* stream);

/* q3t_gemv (its split-K kernel, for any K) for nb = 1 or 2 input vectors at once:
 * x [nb, k] -> y [nb, N] (SwiGLU: [nb, N / 2]), each weight row read once; each vector gets its own
 * RMSNorm and its outputs are those of a one-vector call, bit for bit. nb * k <= 12288. */
Q3T_API int q3t_gemv_batch(int dtype, const void* w, int n_rows, int k, const float* x, int nb, const float* norm_w, float eps, const float* bias, float* y, int mode, void* stream);

/* The attention step of one query position, for the Talker's long context: qkv [(hq + 2 hkv) * d]
 * -> per-head RMSNorm of q and k, rotate-half RoPE at position pos = (*pos_ptr if pos_ptr) + pos_add,
 * k and v appended to the caches at row pos (cache rows are [hkv * d], `dtype`; cos/sin tables are
 * [max_seq, d] f32), then GQA attention of q over cache rows 0..pos with a float32 softmax into
 * out [hq * d]. The context is cut into at most `splits` chunks, one block each per head; with
 * splits > 1 scratch holds hq * splits * (d + 2) floats and then hq int32 counters that must be 0
 * before the first call (each call leaves them 0): the last block of each head merges the chunks.
 * Reads the cache rows before pos before it waits for the previous kernel (programmatic dependent
 * launch): they must not be written by that kernel. */
Q3T_API int q3t_rope_attention_split(int dtype, const float* qkv, const float* q_norm_w, const float* k_norm_w, float eps, const float* cos_tab, const float* sin_tab, const int* pos_ptr, int pos_add, int hq, int hkv, int d, int max_seq, float scale, int splits, float* scratch, void* k_cache, void* v_cache, float* out, void* stream);

/* q3t_rope_attention_split (one chunk) for short caches (max_seq <= 64, d <= 256, max_seq * d <= 4096:
 * the CodePredictor's 16 positions), one block per q head; no scratch; out [hq * d]. Reads the cache
 * rows before pos before it waits for the previous kernel (programmatic dependent launch): they must
 * not be written by that kernel. */
Q3T_API int q3t_rope_attention(int dtype, const float* qkv, const float* q_norm_w, const float* k_norm_w, float eps, const float* cos_tab, const float* sin_tab, const int* pos_ptr, int pos_add, int hq, int hkv, int d, int max_seq, float scale, void* k_cache, void* v_cache, float* out, void* stream);

/* q3t_rope_attention at positions 0..n-1 of an empty short cache, in one launch (the
 * CodePredictor's first two positions): qkv [n, (hq + 2 hkv) d] -> out [n, hq d], rows 0..n-1
 * appended to the caches. Same limits as q3t_rope_attention and n <= max_seq; each position's output
 * and cache row are those of q3t_rope_attention at that position (called in order), bit for bit. */
Q3T_API int q3t_rope_attention_first(int dtype, const float* qkv, const float* q_norm_w, const float* k_norm_w, float eps, const float* cos_tab, const float* sin_tab, int n, int hq, int hkv, int d, int max_seq, float scale, void* k_cache, void* v_cache, float* out, void* stream);

/* out[h] = table[*token_ptr][h] (row of an embedding table, `dtype`), converted to float32. */
Q3T_API int q3t_embed_row(int dtype, const void* table, int rows, int h, const int* token_ptr, float* out, void* stream);

/* Next Talker input: out = sum_j tables[j][codes[j]] for j < n_tables (device array of table
 * pointers, table 0 [rows_first, h], the others [rows, h], `dtype`) + (step < n_trailing ? trailing[step] : pad), with
 * step = *step_ptr. trailing [n_trailing, h] and pad [h] are float32. */
Q3T_API int q3t_embed_sum(int dtype, const void* const* tables, int n_tables, int rows_first, int rows, int h, const int* codes, const float* trailing, int n_trailing, const float* pad, const int* step_ptr, float* out, void* stream);

/* Logits processing and one draw, in one block, over logits [v] (left unchanged):
 * repetition penalty over ids with seen[id] != 0 (if seen and penalty != 1), EOS masked while
 * *step_ptr < min_new_tokens (if eos >= 0), ids in [suppress_lo, suppress_hi) masked except
 * eos, then greedy argmax or (flags & Q3T_SAMPLE_DO_SAMPLE) temperature, top-k (<= 0: off),
 * top-p (>= 1: off) and a Philox4x32-10 draw keyed by (*seed_ptr, *step_ptr, stream_id); the seed
 * lives on the device so one captured graph serves every request.
 * The id goes to *out_code and, if seen, seen[id] = 1. With row_table (else NULL), row_out [row_h]
 * = row id of row_table [row_rows, row_h] (`row_dtype`) as float32, like q3t_embed_row. */
Q3T_API int q3t_sample(const float* logits, int v, unsigned char* seen, float penalty, int eos, int min_new_tokens, int suppress_lo, int suppress_hi, int flags, float temperature, int top_k, float top_p, const unsigned long long* seed_ptr, int stream_id, const int* step_ptr, int* out_code, int row_dtype, const void* row_table, int row_rows, int row_h, float* row_out, void* stream);

/* dst[row * n + i] = src[i] for i < n, row = *row_ptr, skipped when row is outside [0, max_rows).
 * Appends a frame's codes to the history buffer inside a captured graph. */
Q3T_API int q3t_store_row(const int* src, int n, int* dst, const int* row_ptr, int max_rows, void* stream);

/* p[i] += delta for i < n, on the device (advances positions/step counters inside a captured graph). */
Q3T_API int q3t_add_i32(int* p, int n, int delta, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* Q3T_H */
