// Embedding-row gathers whose row index lives on the device (a code sampled earlier in the
// same captured graph): the CodePredictor's per-pass input, and the 16-code sum plus trailing
// text vector that becomes the next Talker input (of one stream, or of each row of a batched step).
#include "common.cuh"

namespace {
constexpr int kThreads = 256;

template <typename T>
__global__ void k_embed_row(const T* __restrict__ table, int rows, int h, const int* __restrict__ token_ptr,
                            float* __restrict__ out) {
    q3t_grid_dep_trigger_first();
    copy_embedding_row(table, rows, h, *token_ptr, out, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

// Element i of sum_j tables[j][codes[j]] + extra[i]: summed in code-group order 0..15, then the text
// vector, like the reference. Codes are clamped into their table (a bad id must not read out of bounds).
template <typename T>
__device__ __forceinline__ float code_sum(const T* const* __restrict__ tables, int n_tables, int rows_first, int rows,
                                          int h, const int* __restrict__ codes, const float* __restrict__ extra, int i) {
    float acc = 0.f;
    for (int j = 0; j < n_tables; ++j) {
        const int r = j == 0 ? rows_first : rows;
        int c = codes[j];
        c = c < 0 ? 0 : (c >= r ? r - 1 : c);
        acc += Elem<T>::load(tables[j] + (size_t)c * h, i);
    }
    return acc + extra[i];
}

template <typename T>
__global__ void k_embed_sum(const T* const* __restrict__ tables, int n_tables, int rows_first, int rows, int h,
                            const int* __restrict__ codes, const float* __restrict__ trailing, int n_trailing,
                            const float* __restrict__ pad, const int* __restrict__ step_ptr, float* __restrict__ out) {
    q3t_grid_dep_trigger_first();
    const int step = *step_ptr;
    const float* extra = (step >= 0 && step < n_trailing) ? trailing + (size_t)step * h : pad;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < h; i += gridDim.x * blockDim.x)
        out[i] = code_sum(tables, n_tables, rows_first, rows, h, codes, extra, i);
}

// The rows of a batched step, row blockIdx.y: its codes, and its slot's trailing text or pad row.
template <typename T>
__global__ void k_batched_embed_sum(const T* const* __restrict__ tables, int n_tables, int rows_first, int rows, int h,
                                    const int* __restrict__ codes, const int* __restrict__ slot,
                                    const float* __restrict__ trailing, int max_trailing,
                                    const int* __restrict__ n_trailing, const float* __restrict__ pad,
                                    const int* __restrict__ step, float* __restrict__ out) {
    q3t_grid_dep_trigger_first();
    const int r = blockIdx.y, s = slot[r];
    out += (size_t)r * h;
    if (s < 0) {  // a padding row: zeros, so the GEMVs that read it stay finite
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < h; i += gridDim.x * blockDim.x) out[i] = 0.f;
        return;
    }
    const int st = step[s], n = min(n_trailing[s], max_trailing);
    const float* extra = (st >= 0 && st < n) ? trailing + ((size_t)s * max_trailing + st) * h : pad + (size_t)s * h;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < h; i += gridDim.x * blockDim.x)
        out[i] = code_sum(tables, n_tables, rows_first, rows, h, codes + (size_t)r * n_tables, extra, i);
}
}  // namespace

extern "C" Q3T_API int q3t_embed_row(int dtype, const void* table, int rows, int h, const int* token_ptr, float* out,
                                     void* stream) {
    if (!table || !token_ptr || !out || rows <= 0 || h <= 0) return q3t_fail("q3t_embed_row: bad arguments");
    const int blocks = (h + kThreads - 1) / kThreads;
    cudaStream_t s = Q3T_STREAM(stream);
    if (dtype == Q3T_F32)
        q3t_launch(k_embed_row<float>, blocks, kThreads, 0, s, static_cast<const float*>(table), rows, h, token_ptr, out);
    else if (dtype == Q3T_BF16)
        q3t_launch(k_embed_row<uint16_t>, blocks, kThreads, 0, s, static_cast<const uint16_t*>(table), rows, h, token_ptr, out);
    else
        return q3t_fail("q3t_embed_row: unknown dtype %d", dtype);
    return q3t_check_launch("q3t_embed_row");
}

extern "C" Q3T_API int q3t_embed_sum(int dtype, const void* const* tables, int n_tables, int rows_first, int rows, int h,
                                     const int* codes, const float* trailing, int n_trailing, const float* pad,
                                     const int* step_ptr, float* out, void* stream) {
    if (!tables || n_tables <= 0 || rows_first <= 0 || rows <= 0 || h <= 0 || !codes || !pad || !step_ptr || !out ||
        (n_trailing > 0 && !trailing))
        return q3t_fail("q3t_embed_sum: bad arguments");
    const int blocks = (h + kThreads - 1) / kThreads;
    cudaStream_t s = Q3T_STREAM(stream);
    if (dtype == Q3T_F32)
        q3t_launch(k_embed_sum<float>, blocks, kThreads, 0, s, reinterpret_cast<const float* const*>(tables), n_tables, rows_first, rows, h,
                                                       codes, trailing, n_trailing, pad, step_ptr, out);
    else if (dtype == Q3T_BF16)
        q3t_launch(k_embed_sum<uint16_t>, blocks, kThreads, 0, s, reinterpret_cast<const uint16_t* const*>(tables), n_tables,
                                                          rows_first, rows, h, codes, trailing, n_trailing, pad, step_ptr, out);
    else
        return q3t_fail("q3t_embed_sum: unknown dtype %d", dtype);
    return q3t_check_launch("q3t_embed_sum");
}

extern "C" Q3T_API int q3t_batched_embed_sum(int dtype, const void* const* tables, int n_tables, int rows_first,
                                             int rows, int h, const int* codes, int nb, const int* slot,
                                             const float* trailing, int max_trailing, const int* n_trailing,
                                             const float* pad, const int* step, float* out, void* stream) {
    if (!tables || n_tables <= 0 || rows_first <= 0 || rows <= 0 || h <= 0 || !codes || !slot || !n_trailing || !pad ||
        !step || !out || nb < 1 || nb > Q3T_BATCH_MAX || max_trailing < 0 || (max_trailing > 0 && !trailing))
        return q3t_fail("q3t_batched_embed_sum: bad arguments (nb=%d)", nb);
    const dim3 grid((h + kThreads - 1) / kThreads, nb);
    cudaStream_t s = Q3T_STREAM(stream);
    if (dtype == Q3T_F32)
        q3t_launch(k_batched_embed_sum<float>, grid, kThreads, 0, s, reinterpret_cast<const float* const*>(tables),
                   n_tables, rows_first, rows, h, codes, slot, trailing, max_trailing, n_trailing, pad, step, out);
    else if (dtype == Q3T_BF16)
        q3t_launch(k_batched_embed_sum<uint16_t>, grid, kThreads, 0, s, reinterpret_cast<const uint16_t* const*>(tables),
                   n_tables, rows_first, rows, h, codes, slot, trailing, max_trailing, n_trailing, pad, step, out);
    else
        return q3t_fail("q3t_batched_embed_sum: unknown dtype %d", dtype);
    return q3t_check_launch("q3t_batched_embed_sum");
}
