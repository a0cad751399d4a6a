/* q3t: fused GPU kernels for the Qwen3-TTS decode loop (one stream, and batched steps of up to 16).
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
 * are Q3T_F32 or Q3T_BF16 (the `dtype` argument); the GEMVs' matrices may also be Q3T_I8;
 * accumulation is float32.
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
#define Q3T_ABI_VERSION 14

#define Q3T_F32 0
#define Q3T_BF16 1
/* Weight-only int8 (the GEMVs' matrices only): q [N, K] int8 in [-127, 127] and one float32 scale per
 * row (w_scale [N], per physical row, so SwiGLU's interleaved gate/up rows have one each). The GEMVs
 * compute y[n] = (sum_k q[n, k] * xn[k]) * w_scale[n] (+ bias): the integers widened exactly in
 * registers, float32 sums, the scale once per row after the sum (model/quant.py quantizes). */
#define Q3T_I8 2

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

/* Whether the tensor-core batched GEMV splits K across thread-block clusters where its plan allows
 * (CUDA sm_90+; on by default). Off, it keeps the partial sums in global scratch: the same bits (A/B
 * runs). Process-wide, from the next launch on; a no-op where the kernel has no clusters. */
Q3T_API int q3t_set_gemv_clusters(int enable);

/* Whether the tensor-core batched GEMV takes more than 16 vectors in one launch (16 at a time inside each
 * block, the matrix read once) instead of one launch per 16 (off by default until measured on a GPU; the
 * same bits either way). Process-wide, from the next launch on; a no-op where the kernel is not used. */
Q3T_API int q3t_set_gemv_groups(int enable);

/* Whether the split-K GEMV plans int8 rows for the most 16-byte loads in flight per lane (of the plans whose
 * grid runs in the fewest waves, the smallest grid) instead of the largest grid, as for bf16 (default off:
 * an experiment on int8's bytes in flight, kernels/device/bench_gemv.py). Process-wide, for later launches. */
Q3T_API int q3t_set_i8_deep(int enable);

/* Whether q3t_gemv and q3t_gemv_batch take int8 weights on int8 tensor cores (CUDA sm_80+, K a multiple of 64,
 * 16-byte aligned operands; x as four int8 digits of a power-of-two scale, the sums exact in int32: not the
 * FMA kernels' bits; kernels/src/gemv_i8_mma.cu). Off by default: measured slower than the FMA kernels.
 * Process-wide, for later launches; a no-op on HIP. */
Q3T_API int q3t_set_i8_mma(int enable);

/* y = RMSNorm(x) * w over n elements (statistics in float32). */
Q3T_API int q3t_rmsnorm(const float* x, const float* w, float* y, int n, float eps, void* stream);

/* y (mode) W[N, K] @ xn, xn = norm_w ? RMSNorm(x) * norm_w : x. bias may be NULL. K <= 8192.
 * w_scale: NULL, except for dtype Q3T_I8, which needs it (W = q * w_scale per row, above). Any K; rows
 * whose start is 16-byte aligned (K a multiple of 16 / 8 / 4 for int8 / bf16 / f32) take 16-byte loads. */
Q3T_API int q3t_gemv(int dtype, const void* w, const float* w_scale, int n_rows, int k, const float* x, const float* norm_w, float eps, const float* bias, float* y, int mode, void* stream);

/* q3t_gemv (its split-K kernel, for any K) for nb = 1 or 2 input vectors at once:
 * x [nb, k] -> y [nb, N] (SwiGLU: [nb, N / 2]), each weight row read once; each vector gets its own
 * RMSNorm and its outputs are those of a one-vector call, bit for bit. nb * k <= 12288. */
Q3T_API int q3t_gemv_batch(int dtype, const void* w, const float* w_scale, int n_rows, int k, const float* x, int nb, const float* norm_w, float eps, const float* bias, float* y, int mode, void* stream);

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

/* ---------------------------------------------------------------------------------------------
 * Batched decode step: one step advances up to Q3T_BATCH_MAX streams, every weight matrix read once
 * for up to 16 of them (q3t_batched_gemv).
 *
 * Rows and slots. A step works on nb rows, one per stream. Each stream owns a slot (an index into
 * the per-slot state: its KV cache, position, frame counter, seed, sampling parameters,
 * repetition-penalty set, trailing text and code history); `slot` [nb] (device int32) maps row r
 * to its slot, so one graph captured for a bucket of nb rows serves any set of streams, and
 * slot[r] < 0 marks a padding row: the kernels leave every slot's state alone for it and its
 * outputs are unspecified (finite where a later GEMV reads them: q3t_batched_embed_sum writes zeros).
 * Per-slot state is read from device arrays indexed by slot: pos [slots] (Talker position of the next
 * input), step [slots] (frame index), seed [slots] (uint64), params [slots] (q3t_sample_params), and
 * the caches below; activations are [nb, ...] row-major, row r at r * (row length).
 * Talker KV cache: [slots, layers, 2, max_seq, kv_heads, head_dim] (`dtype`), so one slot's
 * [layers, 2, max_seq, kv, hd] block is an ordinary single-stream cache (the torch prefill writes it
 * directly); the attention takes layer l's K and V of slot 0 and the distance between slots in cache
 * rows (of kv_heads * head_dim elements: layers * 2 * max_seq). CodePredictor caches are per row.
 *
 * Row independence: every kernel below computes each row exactly as it computes it at nb = 1, in an
 * order of float32 operations fixed by the shapes and the device (never by nb, the bucket, or the other
 * rows' data), and each draw is keyed by its own stream's (seed, step, code index). So a stream's logits
 * and codes are bit for bit the same whichever streams share its steps and whatever nb is. (The
 * batched GEMV and the Talker's batched attention sum in their own fixed orders, not the one-stream
 * kernels': the two agree to float32 rounding.)
 */
#define Q3T_BATCH_MAX 64

/* One slot's logits processing and draw (q3t_sample's scalar arguments), 32 bytes. */
typedef struct q3t_sample_params {
    int flags;           /* Q3T_SAMPLE_DO_SAMPLE */
    float temperature;
    int top_k;           /* <= 0: off */
    float top_p;         /* >= 1: off */
    float penalty;       /* repetition penalty over the slot's seen set (1: off; > 0) */
    int eos;             /* < 0: none */
    int min_new_tokens;  /* eos masked while the slot's step < this */
    int reserved;        /* 0 */
} q3t_sample_params;

/* q3t_gemv for nb (1..Q3T_BATCH_MAX) input vectors: x [nb, k] -> y [nb, N] (SwiGLU: [nb, N / 2]),
 * each vector gets its own RMSNorm; ADD adds to its own row of y. The FMA kernel reads the matrix once per 16
 * vectors (16 a launch), the tensor-core kernel too, or once for all of them with q3t_set_gemv_groups(1).
 * k a multiple of 16 (int8), 8 (bf16) or 4 (f32); w, x, norm_w 16-byte aligned; y must not overlap x;
 * w_scale as for q3t_gemv (int8 only).
 * scratch: NULL, or scratch_floats floats of device memory, zero before its first use (each call
 * leaves it so), of at least q3t_batched_gemv_scratch_floats(dtype, n_rows, k): with it, bf16 and int8
 * weights on CUDA sm_80+ take the tensor-core kernel (int8 widened exactly to bf16 in registers;
 * another fixed order of summation: a vector's bits still never depend on nb or its batch-mates);
 * without it, or elsewhere, the FMA kernel. One scratch serves calls in sequence on one stream, not
 * concurrent ones. */
Q3T_API int q3t_batched_gemv(int dtype, const void* w, const float* w_scale, int n_rows, int k, const float* x, int nb, const float* norm_w, float eps, const float* bias, float* y, int mode, float* scratch, long long scratch_floats, void* stream);

/* The scratch floats q3t_batched_gemv needs for this shape to take the tensor-core kernel (0: none,
 * also where that kernel does not apply); -1 on bad arguments. */
Q3T_API long long q3t_batched_gemv_scratch_floats(int dtype, int n_rows, int k);

/* q3t_rope_attention_split for nb rows: qkv [nb, (hq + 2 hkv) d] -> out [nb, hq d]; row r attends
 * in slot slot[r]'s cache (k_cache, v_cache: this layer's K and V of slot 0, slots slot_rows cache
 * rows apart) at position pos[slot[r]]. scratch: nb blocks of hq * splits * (d + 2) floats followed
 * by hq int32 counters, the counters 0 before the first call (each call leaves them 0).
 * The q heads of a KV group run together (hq / hkv = 1, 2 or 4; d a multiple of 8), each K/V row read
 * once for them: the appended cache row is q3t_rope_attention_split's bit for bit, the output agrees
 * with it to float32 rounding (its sums run in another fixed order). */
Q3T_API int q3t_batched_rope_attention_split(int dtype, const float* qkv, const float* q_norm_w, const float* k_norm_w, float eps, const float* cos_tab, const float* sin_tab, const int* slot, const int* pos, int nb, int hq, int hkv, int d, int max_seq, float scale, int splits, float* scratch, void* k_cache, void* v_cache, int slot_rows, float* out, void* stream);

/* q3t_rope_attention for nb rows at the same position (*pos_ptr if pos_ptr) + pos_add (the
 * CodePredictor): qkv [nb, (hq + 2 hkv) d] -> out [nb, hq d]; row r's short cache is row_rows cache
 * rows past row 0's. */
Q3T_API int q3t_batched_rope_attention(int dtype, const float* qkv, const float* q_norm_w, const float* k_norm_w, float eps, const float* cos_tab, const float* sin_tab, const int* pos_ptr, int pos_add, int nb, int hq, int hkv, int d, int max_seq, float scale, void* k_cache, void* v_cache, int row_rows, float* out, void* stream);

/* q3t_rope_attention_first for nb rows: qkv [nb, n, (hq + 2 hkv) d] -> out [nb, n, hq d], row r's
 * positions 0..n-1 in its short cache (row_rows cache rows past row 0's). */
Q3T_API int q3t_batched_rope_attention_first(int dtype, const float* qkv, const float* q_norm_w, const float* k_norm_w, float eps, const float* cos_tab, const float* sin_tab, int n, int nb, int hq, int hkv, int d, int max_seq, float scale, void* k_cache, void* v_cache, int row_rows, float* out, void* stream);

/* q3t_sample for nb rows, one block each: logits [nb, v] (left unchanged); row r draws with its
 * slot's params, seed and step (Philox keyed by (seed[s], step[s], stream_id), s = slot[r]), the
 * repetition penalty over seen + s * v (seen may be NULL: no penalty), ids in [suppress_lo,
 * suppress_hi) masked except eos. The id goes to out_codes[r * out_stride] and, with seen, seen[s * v
 * + id] = 1; with row_table (else NULL) row_out + r * row_stride gets that id's row as float32. */
Q3T_API int q3t_batched_sample(const float* logits, int v, int nb, const int* slot, const q3t_sample_params* params, const unsigned long long* seed, const int* step, unsigned char* seen, int suppress_lo, int suppress_hi, int stream_id, int* out_codes, int out_stride, int row_dtype, const void* row_table, int row_rows, int row_h, float* row_out, int row_stride, void* stream);

/* q3t_embed_sum for nb rows: codes [nb, n_tables] -> out [nb, h]; row r adds its slot's trailing text
 * row step[s] (trailing [slots, max_trailing, h], the slot's first n_trailing[s] rows valid) or, past
 * them, its pad row (pad [slots, h]). A padding row gets zeros. */
Q3T_API int q3t_batched_embed_sum(int dtype, const void* const* tables, int n_tables, int rows_first, int rows, int h, const int* codes, int nb, const int* slot, const float* trailing, int max_trailing, const int* n_trailing, const float* pad, const int* step, float* out, void* stream);

/* q3t_rmsnorm for nb rows: x [nb, n] -> y [nb, n]. */
Q3T_API int q3t_batched_rmsnorm(const float* x, const float* w, float* y, int n, int nb, float eps, void* stream);

/* The glue of a batched step's vendor-BLAS matrix products (gemm_glue.cu), rows up to 2 Q3T_BATCH_MAX:
 * q3t_batched_rows_bf16: x [rows, n] float32 -> y [rows, n] bf16, RMS-normalised by w (eps) unless w is NULL;
 * q3t_batched_swiglu: gate_up [rows, 2 n] (gate, up interleaved) -> silu(gate) * up into y [rows, n] float32
 * and y_bf16 [rows, n] bf16. */
Q3T_API int q3t_batched_rows_bf16(const float* x, const float* w, float eps, void* y, int n, int rows, void* stream);
Q3T_API int q3t_batched_swiglu(const float* gate_up, float* y, void* y_bf16, int n, int rows, void* stream);

/* history [slots, max_frames, n]: history[s][step[s]] = codes[r] (codes [nb, n]) for each row's slot s,
 * skipped when step[s] is outside [0, max_frames). */
Q3T_API int q3t_batched_store_codes(const int* codes, int n, int nb, const int* slot, const int* step, int* history, int max_frames, void* stream);

/* pos[s] += 1 and step[s] += 1 for each row's slot s (either array may be NULL): the end of a step. */
Q3T_API int q3t_batched_advance(const int* slot, int nb, int* pos, int* step, void* stream);

/* CodePredictor positions first..last of one stream's frame in one persistent launch (CUDA sm_90+, bf16
 * weights and caches; fails elsewhere): for each position j its layers, the final norm (final_norm) + lm_head
 * and the draw of code j (q3t_sample's logits processing without penalty, EOS mask or suppression,
 * Philox bits of (step, j)) into codes[j]; position j + 1's input is row codes[j] of inputs[j]. The draw
 * takes flags, temperature, top_k and top_p, or with params those of params[s] (its other fields unused),
 * and the seed seed_ptr[s] and frame step_ptr[s], s = *slot (0 without slot; s < 0: nothing runs). On entry
 * x [hidden] holds position first's input row and the caches rows 0..first-1. layer_ptrs: n_layers x 10
 * host pointers (in_norm, qkv, q_norm, k_norm, o, post_norm, gate_up interleaved, down, k_cache,
 * v_cache [max_seq, hkv, d]); heads and inputs: 15 host pointers each, for positions 1..15 (lm_head j
 * [vocab, hidden], input table j [vocab, hidden] of input_dtype). qkv, attn, mlp and logits are work
 * buffers; sync: two uint32 zeros, left zero. trace (NULL: none): block 0's clock64 at each step, per position
 * 23 per layer (qkv, o, gate/up, down: start, input staged, weights landed, computed, past the barrier; between
 * qkv and o the attention: start, computed, past the barrier), 5 for the head and 1 after the draw. One block per SM; GEMV sums in another order than
 * q3t_gemv's (float32 rounding apart), attention and cache rows q3t_rope_attention's bit for bit. */
Q3T_API int q3t_cp_passes(int dtype, const void* const* layer_ptrs, int n_layers, const void* const* heads, const void* const* inputs, int input_dtype, int first, int last, int hidden, int inter, int hq, int hkv, int d, int max_seq, int vocab, float eps, float scale, const float* final_norm, const float* cos_tab, const float* sin_tab, float* x, float* qkv, float* attn, float* mlp, float* logits, int* codes, int flags, float temperature, int top_k, float top_p, const int* slot, const q3t_sample_params* params, const unsigned long long* seed_ptr, const int* step_ptr, unsigned* sync, long long* trace, void* stream);

/* The codec decoder's SnakeBeta activation (model/codec.py): y = x + inv_beta[c] * sin(x * alpha[c])^2 for x
 * [batch, channels, t] of dtype (Q3T_F32 or Q3T_BF16; alpha and inv_beta [channels], the same dtype), each op
 * rounded to dtype as torch's ops round it. x and y are strided (batch and channel strides in elements, last
 * stride 1), so y may be a slice of a larger buffer (the conv's left context before it). A plain launch (no PDL). */
Q3T_API int q3t_snake_beta(int dtype, const void* x, long long x_batch, long long x_channel, const void* alpha, const void* inv_beta, void* y, long long y_batch, long long y_channel, int batch, int channels, int t, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* Q3T_H */
