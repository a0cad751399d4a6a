// q3t_batched_sample: the logits processing and draw of q3t_sample (sample_block.cuh) for the rows of
// a batched step, one 1024-thread block per row, each with its own slot's parameters, seed, frame
// counter and repetition-penalty set, so one captured graph serves any mix of requests. A row's
// draw is what q3t_sample draws with the same arguments, bit for bit.
#include "sample_block.cuh"

namespace {
constexpr int kThreads = 1024;  // as q3t_sample

__global__ void __launch_bounds__(kThreads) k_batched_sample(
    const float* __restrict__ logits, int v, const int* __restrict__ slot, const q3t_sample_params* __restrict__ params,
    const unsigned long long* __restrict__ seed, const int* __restrict__ step, unsigned char* __restrict__ seen,
    int sup_lo, int sup_hi, int stream_id, int* __restrict__ out_codes, int out_stride, int row_dtype,
    const void* __restrict__ row_table, int row_rows, int row_h, float* __restrict__ row_out, int row_stride) {
    const int r = blockIdx.x, s = slot[r];
    if (s < 0) return;  // a padding row
    // Before the wait, as q3t_sample: the slot's parameters and seed (set before the step), its
    // frame counter (advanced at the end of the previous step, a GEMV ago) and the draw's bits.
    const q3t_sample_params p = params[s];
    const int st = step[s];
    const uint32_t bits = draw_bits(seed + s, stream_id, st);
    q3t_grid_dep_trigger_first();
    __shared__ float L[kSampleMaxV];
    __shared__ int cand[kSampleMaxV];
    const int tok = sample_block<kThreads>(logits + (size_t)r * v, v, seen ? seen + (size_t)s * v : nullptr, p.penalty,
                                           p.eos, p.min_new_tokens, sup_lo, sup_hi, p.flags, p.temperature, p.top_k,
                                           p.top_p, st, bits, out_codes + (size_t)r * out_stride, L, cand);
    if (row_table) copy_drawn_row(row_dtype, row_table, row_rows, row_h, tok, row_out + (size_t)r * row_stride);
}
}  // namespace

extern "C" Q3T_API int q3t_batched_sample(const float* logits, int v, int nb, const int* slot,
                                          const q3t_sample_params* params, const unsigned long long* seed,
                                          const int* step, unsigned char* seen, int suppress_lo, int suppress_hi,
                                          int stream_id, int* out_codes, int out_stride, int row_dtype,
                                          const void* row_table, int row_rows, int row_h, float* row_out,
                                          int row_stride, void* stream) {
    if (!logits || !slot || !params || !seed || !step || !out_codes || v <= 0 || v > kSampleMaxV || nb < 1 ||
        nb > Q3T_BATCH_MAX)
        return q3t_fail("q3t_batched_sample: bad arguments (v=%d, max %d; nb=%d, max %d)", v, kSampleMaxV, nb,
                        Q3T_BATCH_MAX);
    if (row_table && (!row_out || row_rows <= 0 || row_h <= 0 || row_stride < row_h ||
                      (row_dtype != Q3T_F32 && row_dtype != Q3T_BF16)))
        return q3t_fail("q3t_batched_sample: bad embedding row arguments (rows=%d h=%d stride=%d dtype=%d)", row_rows,
                        row_h, row_stride, row_dtype);
    q3t_launch(k_batched_sample, nb, kThreads, 0, Q3T_STREAM(stream), logits, v, slot, params, seed, step, seen,
               suppress_lo, suppress_hi, stream_id, out_codes, out_stride, row_dtype, row_table, row_rows, row_h,
               row_out, row_stride);
    return q3t_check_launch("q3t_batched_sample");
}
