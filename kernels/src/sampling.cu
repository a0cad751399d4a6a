// q3t_sample: logits processing and one draw in a single 1024-thread block, so the sampled id
// never leaves the device inside a frame. The device code is sample_block.cuh.
#include "sample_block.cuh"

namespace {
constexpr int kThreads = 1024;  // 512 measured equal, 256 slower (H200, docs/performance.md)

__global__ void __launch_bounds__(kThreads) k_sample(const float* __restrict__ logits, int v, unsigned char* __restrict__ seen,
                                                     float penalty, int eos, int min_new, int sup_lo, int sup_hi,
                                                     int flags, float temperature, int top_k, float top_p,
                                                     const unsigned long long* __restrict__ seed_ptr, int stream_id,
                                                     const int* __restrict__ step_ptr, int* __restrict__ out_code,
                                                     int row_dtype, const void* __restrict__ row_table, int row_rows,
                                                     int row_h, float* __restrict__ row_out) {
    // Before the wait: the frame counter (advanced by q3t_add_i32 at the end of the previous frame;
    // a GEMV follows it, so it has finished when this kernel starts, see q3t_grid_dep) and the
    // seed (set before the frame), and from them the draw's random bits.
    const int step = step_ptr ? *step_ptr : 0;
    const uint32_t bits = draw_bits(seed_ptr, stream_id, step);
    q3t_grid_dep_trigger_first();
    __shared__ float L[kSampleMaxV];
    __shared__ int cand[kSampleMaxV];
    const int tok = sample_block<kThreads>(logits, v, seen, penalty, eos, min_new, sup_lo, sup_hi, flags, temperature,
                                           top_k, top_p, step, bits, out_code, L, cand);
    if (row_table) copy_drawn_row(row_dtype, row_table, row_rows, row_h, tok, row_out);
}
}  // namespace

extern "C" Q3T_API int q3t_sample(const float* logits, int v, unsigned char* seen, float penalty, int eos,
                                  int min_new_tokens, int suppress_lo, int suppress_hi, int flags, float temperature,
                                  int top_k, float top_p, const unsigned long long* seed_ptr, int stream_id, const int* step_ptr,
                                  int* out_code, int row_dtype, const void* row_table, int row_rows, int row_h,
                                  float* row_out, void* stream) {
    if (!logits || !out_code || v <= 0 || v > kSampleMaxV)
        return q3t_fail("q3t_sample: bad arguments (v=%d, max %d)", v, kSampleMaxV);
    if (row_table && (!row_out || row_rows <= 0 || row_h <= 0 || (row_dtype != Q3T_F32 && row_dtype != Q3T_BF16)))
        return q3t_fail("q3t_sample: bad embedding row arguments (rows=%d h=%d dtype=%d)", row_rows, row_h, row_dtype);
    if (penalty <= 0.f) return q3t_fail("q3t_sample: repetition penalty must be > 0, got %g", (double)penalty);
    q3t_launch(k_sample, 1, kThreads, 0, Q3T_STREAM(stream), logits, v, seen, penalty, eos, min_new_tokens, suppress_lo,
                                                     suppress_hi, flags, temperature, top_k, top_p, seed_ptr, stream_id,
                                                     step_ptr, out_code, row_dtype, row_table, row_rows, row_h, row_out);
    return q3t_check_launch("q3t_sample");
}
