// The per-slot bookkeeping at the end of a batched step: each row's codes into its slot's history at
// the slot's frame index, and the slots' position and frame counters advanced, all on the device so
// the step's graph stays valid for any set of streams.
#include "common.cuh"

namespace {
__global__ void k_batched_store_codes(const int* __restrict__ codes, int n, const int* __restrict__ slot,
                                      const int* __restrict__ step, int* __restrict__ history, int max_frames) {
    q3t_grid_dep_trigger_first();
    const int r = blockIdx.x, s = slot[r];
    if (s < 0) return;
    const int f = step[s];
    if (f < 0 || f >= max_frames) return;
    for (int i = threadIdx.x; i < n; i += blockDim.x) history[((size_t)s * max_frames + f) * n + i] = codes[(size_t)r * n + i];
}

__global__ void k_batched_advance(const int* __restrict__ slot, int nb, int* __restrict__ pos, int* __restrict__ step) {
    q3t_grid_dep_trigger_first();
    const int r = threadIdx.x;
    if (r >= nb) return;
    const int s = slot[r];  // distinct per row (one stream per slot), so no two threads add to one counter
    if (s < 0) return;
    if (pos) pos[s] += 1;
    if (step) step[s] += 1;
}
}  // namespace

extern "C" Q3T_API int q3t_batched_store_codes(const int* codes, int n, int nb, const int* slot, const int* step,
                                               int* history, int max_frames, void* stream) {
    if (!codes || !slot || !step || !history || n <= 0 || n > 1024 || max_frames <= 0 || nb < 1 || nb > Q3T_BATCH_MAX)
        return q3t_fail("q3t_batched_store_codes: bad arguments (n=%d nb=%d max_frames=%d)", n, nb, max_frames);
    q3t_launch(k_batched_store_codes, nb, 64, 0, Q3T_STREAM(stream), codes, n, slot, step, history, max_frames);
    return q3t_check_launch("q3t_batched_store_codes");
}

extern "C" Q3T_API int q3t_batched_advance(const int* slot, int nb, int* pos, int* step, void* stream) {
    if (!slot || nb < 1 || nb > Q3T_BATCH_MAX) return q3t_fail("q3t_batched_advance: bad arguments (nb=%d)", nb);
    q3t_launch(k_batched_advance, 1, Q3T_BATCH_MAX, 0, Q3T_STREAM(stream), slot, nb, pos, step);  // a thread a row
    return q3t_check_launch("q3t_batched_advance");
}
