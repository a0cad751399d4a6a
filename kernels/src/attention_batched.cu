// The attention of a batched decode step, each row (stream) on its own K/V cache, position and slices
// of the work buffers, the row in blockIdx.z (Talker) or blockIdx.y / .z (CodePredictor). The
// CodePredictor's short attention runs the one-stream kernels' block code (attention_short.cuh): each
// row's cache rows and outputs are the one-stream kernel's bit for bit. The Talker's long one has a
// kernel of its own (k_batched_rope_attn_grouped: a KV group's heads in one block), whose cache rows
// are the one-stream kernel's and whose outputs agree with it to float32 rounding. Nothing is shared
// between rows, so a row's numbers never depend on what the other rows hold.
#include "common.cuh"
#include "attention_split.cuh"

namespace {

// The cache of slot (or row) s: `stride` cache rows (of hkv d elements) past slot 0's.
template <typename C>
__device__ __forceinline__ C* slot_cache(void* base, int s, int stride, int hkv, int d) {
    return static_cast<C*>(base) + (size_t)s * stride * hkv * d;
}

// The Talker's attention for a batched step: one block per (KV head, chunk of the context, row), the
// group's G q heads together, so each K/V row is read once for all of them (the one-stream kernel's
// block per q head read it G times, one key per warp per step: a chain of memory round trips that,
// with its 80 registers a thread, took 3 waves of blocks at 16 streams and ~68 us a layer at 227
// positions on the H200). Before the PDL wait the block copies the first tile of its chunk's cache
// rows (grouped_tile_rows: 64 of bf16 d = 128) into shared memory (written by earlier steps); after
// it: q of each head and the group's k, v normed and rotated by norm_rope_head (the one-stream
// kernels' arithmetic: the cache row appended here is theirs bit for bit), then per tile: every score
// from shared memory (grouped_lanes_key lanes a key, kDimsLane dims a lane), the tile's softmax
// statistics per head (a warp each), and the weighted values (a thread per head and dimension), an
// online softmax across tiles. A chunk longer than one tile reads its later tiles after the wait. The
// chunks merge as the one-stream kernel's do (merge_if_last): the last block to finish, counted per KV
// head, combines the group's partials.
// Float32 throughout; the sums run in an order fixed by (d, splits, the row's position), never by the
// other rows, so a row's output is the same at any nb and next to any batch-mates.
constexpr int kDimsLane = 8;  // head dims a lane multiplies per key (16 bytes of bf16, two units of float)
constexpr int kTileBytes = 16384;  // one of K or V of a tile in shared memory
constexpr int kMaxTileRows = 64;   // scores a head keeps per tile
constexpr int kGroupedBlocksPerSm = 4;  // 512 blocks at 16 streams, 8 KV heads, 4 chunks: one wave on the H200

template <typename C>
__host__ __device__ constexpr int grouped_tile_rows(int d) {
    return kTileBytes / (d * (int)sizeof(C)) < kMaxTileRows ? kTileBytes / (d * (int)sizeof(C)) : kMaxTileRows;
}
template <typename C>
inline size_t grouped_smem_bytes(int d) {
    return (size_t)2 * grouped_tile_rows<C>(d) * d * sizeof(C);
}
// Lanes that share a key: a power of two covering d with kDimsLane dims each (d <= 256: at most 32).
__host__ __device__ constexpr int grouped_lanes_key(int d) {
    int n = 1;
    while (n * kDimsLane < d) n *= 2;
    return n;
}

// 16 bytes of shared memory (aligned) as floats: 4 float32 or 8 bf16 elements.
__device__ __forceinline__ void load_unit(const float* p, float (&o)[4]) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    o[0] = v.x;
    o[1] = v.y;
    o[2] = v.z;
    o[3] = v.w;
}
__device__ __forceinline__ void load_unit(const uint16_t* p, float (&o)[8]) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        o[2 * j] = bf16_lo(w[j]);
        o[2 * j + 1] = bf16_hi(w[j]);
    }
}

template <typename C, int G>
__global__ void Q3T_LAUNCH_BOUNDS(kThreads, G > 2 ? kGroupedBlocksPerSm - 1 : kGroupedBlocksPerSm) k_batched_rope_attn_grouped(
    const float* __restrict__ qkv_all, const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, const int* __restrict__ slot,
    const int* __restrict__ positions, int hq, int hkv, int d, int max_seq, float scale, int splits, void* k_cache,
    void* v_cache, int slot_rows, float* __restrict__ scratch_all, float* __restrict__ out_all) {
    constexpr int kEpu = 16 / (int)sizeof(C);          // elements in 16 bytes
    constexpr int kUnitsLane = kDimsLane / kEpu;       // 16-byte units a lane reads of a key
    constexpr int kOut = (G * kMaxD + kThreads - 1) / kThreads;  // (head, dim) outputs a thread accumulates
    extern __shared__ float4 tile4[];  // K rows, then V rows: tile_rows d elements each
    __shared__ float q_all[G][kMaxD];
    __shared__ float k_new[kMaxD], v_new[kMaxD];
    __shared__ float sc[G][kMaxTileRows];
    __shared__ float run_m[G], run_l[G], corr[G];
    __shared__ float qs[kMaxD], ks[kMaxD], vs[kMaxD];
    __shared__ float red[32];
    const int kvh = blockIdx.x, split = blockIdx.y, r = blockIdx.z;
    const int tid = threadIdx.x, lane = tid % Q3T_WARP, warp = tid / Q3T_WARP;
    constexpr int kWarps = kThreads / Q3T_WARP;
    // The slot table is set before the step's graph runs; the position by the previous step's
    // q3t_batched_advance, which a GEMV follows (the rule of q3t_grid_dep in common.cuh).
    const int s = slot[r];
    if (s < 0) return;  // a padding row
    int pos = positions[s];
    pos = pos < 0 ? 0 : (pos >= max_seq ? max_seq - 1 : pos);
    const int len = pos + 1;
    const int chunk = chunk_len(len, splits);
    const int n_chunks = (len + chunk - 1) / chunk;
    if (split >= n_chunks) return;  // past the context (the merge counts the n_chunks that run)
    const int begin = split * chunk, end = min(len, begin + chunk);
    const bool has_pos = end == len;  // the chunk that holds pos (the context's last)
    C* kc = slot_cache<C>(k_cache, s, slot_rows, hkv, d);
    C* vc = slot_cache<C>(v_cache, s, slot_rows, hkv, d);
    const int rows = grouped_tile_rows<C>(d);
    C* kt = reinterpret_cast<C*>(tile4);
    C* vt = kt + (size_t)rows * d;
    // Before the wait: the first tile's cache rows (positions before pos) and the head's constants.
    copy_kv_rows<C>(kc, vc, begin, max(0, min(min(end, begin + rows), pos) - begin), kvh, hkv, d, kt, vt);
    const ShortConsts k = short_head_consts(qn, kn, cos_tab, sin_tab, pos, d);
    if (tid < G) {
        run_m[tid] = -INFINITY;
        run_l[tid] = 0.f;
    }
    q3t_grid_dep_trigger_first();

    // q of the group's heads, and its k and v where the chunk holds pos (appended to the cache).
    const float* qkv = qkv_all + (size_t)r * (hq + 2 * hkv) * d;
    float b = 0.f, v = 0.f;
    if (tid < d && has_pos) {
        b = qkv[(size_t)(hq + kvh) * d + tid];
        v = round_to<C>(qkv[(size_t)(hq + hkv + kvh) * d + tid]);
    }
#pragma unroll 1
    for (int j = 0; j < G; ++j) {
        const float a = tid < d ? qkv[(size_t)(kvh * G + j) * d + tid] : 0.f;
        norm_rope_head<C>(a, j == 0 ? b : 0.f, j == 0 ? v : 0.f, k, eps, d, pos, kvh, hkv, has_pos && j == 0, kc, vc,
                          qs, ks, vs, red);
        if (tid < d) {
            q_all[j][tid] = qs[tid];
            if (j == 0) {
                k_new[tid] = ks[tid];
                v_new[tid] = vs[tid];
            }
        }
    }
    __syncthreads();
    // This lane's dims of every head's q: units u = j * kLanesKey + sub of 16 bytes (a key's lanes read
    // whole 16-byte units side by side, so a quarter warp reads 128 contiguous bytes: no bank conflict).
    const int lanes_key = grouped_lanes_key(d), sub = lane % lanes_key, keys_warp = Q3T_WARP / lanes_key;
    const int units = d / kEpu;
    float qr[G][kDimsLane];
#pragma unroll
    for (int j = 0; j < kUnitsLane; ++j)
#pragma unroll
        for (int e = 0; e < kEpu; ++e) {
            const int i = (j * lanes_key + sub) * kEpu + e;
#pragma unroll
            for (int h = 0; h < G; ++h) qr[h][j * kEpu + e] = i < d ? q_all[h][i] : 0.f;
        }
    float acc[kOut];
#pragma unroll
    for (int o = 0; o < kOut; ++o) acc[o] = 0.f;

    for (int tb = begin; tb < end; tb += rows) {
        const int nt = min(rows, end - tb);
        if (tb != begin) {  // a later tile: its cache rows after the wait
            __syncthreads();  // every thread is done with the last tile
            copy_kv_rows<C>(kc, vc, tb, max(0, min(tb + nt, pos) - tb), kvh, hkv, d, kt, vt);
        }
        if (has_pos && tb + nt == end && tid < d) {  // pos: the new row, as the cache now holds it
            Elem<C>::store(kt, (pos - tb) * d + tid, k_new[tid]);
            Elem<C>::store(vt, (pos - tb) * d + tid, v_new[tid]);
        }
        __syncthreads();
        // Scores: key t of the tile by the lanes_key lanes of group lane / lanes_key of a warp.
        for (int t0 = warp * keys_warp; t0 < nt; t0 += kWarps * keys_warp) {
            const int t = t0 + lane / lanes_key;
            float dot[G];
#pragma unroll
            for (int h = 0; h < G; ++h) dot[h] = 0.f;
            if (t < nt) {
#pragma unroll
                for (int j = 0; j < kUnitsLane; ++j) {
                    const int u = j * lanes_key + sub;
                    if (u < units) {
                        float kv[kEpu];
                        load_unit(kt + (size_t)t * d + u * kEpu, kv);
#pragma unroll
                        for (int e = 0; e < kEpu; ++e)
#pragma unroll
                            for (int h = 0; h < G; ++h) dot[h] += qr[h][j * kEpu + e] * kv[e];
                    }
                }
            }
            for (int m = lanes_key / 2; m > 0; m >>= 1)
#pragma unroll
                for (int h = 0; h < G; ++h) dot[h] += Q3T_SHFL_XOR(dot[h], m);
            if (sub == 0 && t < nt)
#pragma unroll
                for (int h = 0; h < G; ++h) sc[h][t] = dot[h] * scale;
        }
        __syncthreads();
        // The tile's statistics, head h by warp h: scores -> weights exp(score - running max).
        if (warp < G) {
            const int h = warp;
            float m = -INFINITY;
            for (int t = lane; t < nt; t += Q3T_WARP) m = fmaxf(m, sc[h][t]);
            m = warp_max(m);
            // The running max is lane 0's alone (read, then written, by it): the warp gets it by shuffle.
            const float m_old = Q3T_SHFL(lane == 0 ? run_m[h] : 0.f, 0), m_new = fmaxf(m_old, m);
            float l = 0.f;
            for (int t = lane; t < nt; t += Q3T_WARP) {
                const float p = expf(sc[h][t] - m_new);
                sc[h][t] = p;
                l += p;
            }
            l = warp_sum(l);
            if (lane == 0) {
                const float c = expf(m_old - m_new);  // 0 on the first tile (m_old = -inf)
                corr[h] = c;
                run_l[h] = run_l[h] * c + l;
                run_m[h] = m_new;
            }
        }
        __syncthreads();
        // Weighted values: output (head e / d, dim e % d) by thread e (and e + kThreads, ...).
#pragma unroll
        for (int o = 0; o < kOut; ++o) {
            const int e = tid + o * kThreads;
            if (e < G * d) {
                const int h = e / d, i = e - h * d;
                float a = acc[o] * corr[h];
#pragma unroll 4
                for (int t = 0; t < nt; ++t) a += sc[h][t] * Elem<C>::load(vt + (size_t)t * d, i);
                acc[o] = a;
            }
        }
    }
    float* out = out_all + (size_t)r * hq * d;
    if (n_chunks == 1) {  // the whole context: the result
#pragma unroll
        for (int o = 0; o < kOut; ++o) {
            const int e = tid + o * kThreads;
            if (e < G * d) out[(size_t)kvh * G * d + e] = acc[o] / run_l[e / d];
        }
        return;
    }
    // Partials (max, sum, accumulator) per head at the one-stream layout: hq * splits * (d + 2) floats
    // then hq int32 counters per row (this kernel counts per KV head, in the first hkv of them).
    float* scratch = scratch_all + (size_t)r * ((size_t)hq * splits * (d + 2) + hq);
    int* counters = reinterpret_cast<int*>(scratch + (size_t)hq * splits * (d + 2));
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
        const int e = tid + o * kThreads;
        if (e < G * d) {
            const int h = e / d, i = e - h * d;
            float* part = scratch + ((size_t)(kvh * G + h) * splits + split) * (d + 2);
            part[2 + i] = acc[o];
            if (i == 0) {
                part[0] = run_m[h];
                part[1] = run_l[h];
            }
        }
    }
    merge_if_last(scratch, counters + kvh, kvh * G, G, d, splits, n_chunks, out);
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

// k_batched_rope_attn_grouped for `group` q heads a KV head (1, 2 or 4; the launcher checked it).
template <typename C>
void launch_grouped(int group, dim3 grid, cudaStream_t s, const float* qkv, const float* qn, const float* kn,
                    float eps, const float* cos_tab, const float* sin_tab, const int* slot, const int* pos, int hq,
                    int hkv, int d, int max_seq, float scale, int splits, void* k_cache, void* v_cache, int slot_rows,
                    float* scratch, float* out) {
    auto kernel = group == 1 ? k_batched_rope_attn_grouped<C, 1>
                             : group == 2 ? k_batched_rope_attn_grouped<C, 2> : k_batched_rope_attn_grouped<C, 4>;
    q3t_launch(kernel, grid, kThreads, grouped_smem_bytes<C>(d), s, qkv, qn, kn, eps, cos_tab, sin_tab, slot, pos, hq,
               hkv, d, max_seq, scale, splits, k_cache, v_cache, slot_rows, scratch, out);
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
    const int group = hq / hkv;
    if (d % 8 || (group != 1 && group != 2 && group != 4))
        return q3t_fail("q3t_batched_rope_attention_split: d=%d (a multiple of 8) and hq / hkv = %d (1, 2 or 4)", d,
                        group);
    const dim3 grid(hkv, splits, nb);
    cudaStream_t s = Q3T_STREAM(stream);
    if (dtype == Q3T_F32)
        launch_grouped<float>(group, grid, s, qkv, q_norm_w, k_norm_w, eps, cos_tab, sin_tab, slot, pos, hq, hkv, d,
                              max_seq, scale, splits, k_cache, v_cache, slot_rows, scratch, out);
    else if (dtype == Q3T_BF16)
        launch_grouped<uint16_t>(group, grid, s, qkv, q_norm_w, k_norm_w, eps, cos_tab, sin_tab, slot, pos, hq, hkv, d,
                                 max_seq, scale, splits, k_cache, v_cache, slot_rows, scratch, out);
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
