// q3t_batched_gemv on tensor cores (CUDA, sm_80+, bf16 or int8 weights): the function of gemv_batched.cu's
// kernel (y[b] (mode) W @ xn[b] for nb <= 64 vectors, RMSNorm fused), computed with mma.sync
// m16n8k16 (bf16 in, float32 accumulation) where that kernel spends one FMA per weight and vector.
//
// Why: at 16 streams the FMA kernel is bound by its own arithmetic (16 FMAs per weight read, x from
// shared memory): a 1.7B step spent 9.3 ms in GEMVs against a 1.1 ms byte floor (H200). On tensor
// cores the arithmetic is free next to the weight reads at any nb <= 16.
// AMD keeps the FMA kernel: on the cards we target (R9700: 640 GB/s) its arithmetic at nb = 16
// (~84 GFLOP per 1.7B step) hides under the 8.3 ms it takes to read the weights at all.
//
// Groups (with q3t_set_gemv_groups(1); off by default until measured, the host then launches 16 at a time).
// Past 16 vectors a block takes them in groups of 16, one after another, on the weights it loaded once
// into registers; each group is computed exactly as a launch of its 16 vectors alone (the bits do not depend
// on the group count), with its own split-K counters and records. Before this, 64 streams took four launches
// a matrix: 1,260 GEMV launches a 1.7B step, each paying the fixed cost of a dependent launch and the weights'
// bytes again (14.1 of a 16.4 ms step, H200).
//
// Layout. Weights are the A operand (16 rows per MMA), the vectors the B operand (8 per MMA: one
// column tile for nb <= 8, two for nb <= 16). A block takes 64 rows (four 16-row tiles) and a slice of
// 2C chunks of 32 k; a warp takes TW = 2 of the tiles over C / 2 chunks of the slice (WarpShape), so each x
// fragment it reads from shared memory feeds two tiles' MMAs: at 16 vectors the fragment loads, not the MMAs
// or the weights, had bounded the kernel (two tiles a warp made the GEMV chains 7-11 % faster at 16 vectors). Lane (g, t)
// loads the 16 bytes at k = 32 c + 8 t of rows g and g + 8 of each of its tiles:
// that is MMA operand A for logical k {2t, 2t+1, 2t+8, 2t+9} of two MMAs (k-halves 8t..8t+3 and
// 8t+4..8t+7), a fixed permutation of k that the vectors' fragments (read from shared memory at the
// same 8t) follow, so every instruction reads whole 32-byte sectors of 8 rows and needs no shuffle.
// All of a lane's weight loads (2C of 16 bytes) go out before the kernel waits for its predecessor.
// Activations stay float32: each x value (times norm_w) is staged as bf16 hi + bf16 lo (hi = x
// rounded, lo = the rest rounded), and W x = W hi + W lo, two MMAs, so x keeps ~16 mantissa bits
// (the weights are bf16 already: no further rounding of the products).
// int8 weights (Q3T_I8): a lane's 16-byte load holds 16 of them, k = 64 c + 16 t .. + 15 of rows g and
// g + 8 (a chunk is 64 k), widened in registers to bf16 pairs, exactly (|q| <= 127 needs 7 bits of
// bf16's 8), and fed to the same MMAs: 8 per chunk and column tile where bf16 has 4, the x fragments
// read at the same 16 t. So a lane's loads per k halve, and C is at most 4 (bf16: 8) to keep the k a
// block stages, and its shared memory, as bf16's. Each row's scale multiplies its finished sum after
// the RMS scale; the scale is loaded with the weights, before the wait.
// Split K across blocks: ks_count blocks share a row tile; each writes its 16 x 64 partial sums (and
// its slice's sums of squares) to scratch, and the last to arrive (a counter per row tile, left 0
// again) adds them in ks order and applies the mode: one launch, no atomics on data, run-to-run
// identical. Blocks cover few rows without it, so each block would read all of x (nb * k * 4 bytes
// for 64 * k * 2 of weights); split, a block reads the slice of x its weights need.
//
// On sm_90 (Hopper) a row tile's ks_count <= 8 blocks run as one thread-block cluster instead: each keeps
// its record in its own shared memory, and after one cluster barrier every block sums a share of the
// tile's sums from all of them (distributed shared memory), in the same ks order. Same bits as the
// scratch path; no round trips to L2 for the record, the fence, the counter and the gather, which in the
// CodePredictor's small GEMVs (8-10 us a launch at 16 vectors) are a large part of a launch.
// Row independence (q3t.h): a vector's sums are fixed by (dtype, k): the plan (C,
// ks_count) depends on nothing else; the two column tiles are separate MMAs (a column's products
// meet only its own accumulators); the partials meet in a fixed order; the sums of squares go in
// fixed segments. So a vector gets the same bits at nb = 1 and in any batch. They are not the FMA
// kernel's bits (tests bound the difference).
#include "common.cuh"

#if defined(Q3T_CUDA)
#include <cooperative_groups.h>

namespace {

constexpr int kThreads = 256;
constexpr int kTileRows = 64;     // weight rows per block: four MMA row tiles of 16
template <typename W> constexpr int kLoadK = WeightVec16<W>::N;  // k per 16-byte load: 8 bf16, 16 int8
template <typename W> constexpr int kChunk = 4 * kLoadK<W>;       // k per chunk: one load per lane and row pair
template <typename W> constexpr int kMaxC = 8 * 32 / kChunk<W>;   // chunks per warp at most: a 512-k slice
constexpr int kMaxCols = 16;      // vectors of a group: two MMA column tiles of 8
constexpr int kGroups = Q3T_BATCH_MAX / kMaxCols;  // groups of a launch at most (nb <= 64)
constexpr int kPartStride = kTileRows + 1;
constexpr int kRecord = kMaxCols * kTileRows + kMaxCols;  // a block's partials in scratch: sums, sums of squares
constexpr int kClusterMax = 8;    // blocks of a cluster at most: the portable cluster size
constexpr int kCounters = 4096;   // (group, row tile) counters at the start of scratch (n_rows <= 65,536)

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// Two floats as packed bf16 (a in the low half), rounded to nearest even: one cvt instruction
// (the bit-twiddled f32_to_bf16 costs ~15 per value, and at 16 vectors the staging was the kernel's
// largest cost, measured as nb 16 against nb 8).
__device__ __forceinline__ uint32_t pack_bf16x2(float a, float b) {
    uint32_t u = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(b), "f"(a));
#endif
    return u;
}

// x (float32) as bf16 hi + lo, two packed pairs each: hi = x rounded, lo = the rest rounded.
__device__ __forceinline__ void split_bf16(float4 v, uint2& hi, uint2& lo) {
    const uint32_t h0 = pack_bf16x2(v.x, v.y), h1 = pack_bf16x2(v.z, v.w);
    hi = make_uint2(h0, h1);
    lo = make_uint2(pack_bf16x2(__fsub_rn(v.x, bf16_lo(h0)), __fsub_rn(v.y, bf16_hi(h0))),
                    pack_bf16x2(__fsub_rn(v.z, bf16_lo(h1)), __fsub_rn(v.w, bf16_hi(h1))));
}

// The 16-byte weight load u of one row as the MMA's A operand: bf16 pairs in k order (p[i] holds k 2i in
// its low half, 2i + 1 in its high half). bf16: u itself. int8: each weight widened exactly (common.cuh),
// its float32's high half the bf16 (|q| <= 128 leaves the low half zero), two packed per PRMT.
template <typename W> __device__ __forceinline__ void bf16_pairs(const uint4& u, uint32_t (&p)[kLoadK<W> / 2]);
template <> __device__ __forceinline__ void bf16_pairs<uint16_t>(const uint4& u, uint32_t (&p)[4]) {
    p[0] = u.x;
    p[1] = u.y;
    p[2] = u.z;
    p[3] = u.w;
}
template <> __device__ __forceinline__ void bf16_pairs<int8_t>(const uint4& u, uint32_t (&p)[8]) {
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        float f[4];
        i8x4_to_f32(words[q], f);
        p[2 * q] = __byte_perm(__float_as_uint(f[0]), __float_as_uint(f[1]), 0x7632);
        p[2 * q + 1] = __byte_perm(__float_as_uint(f[2]), __float_as_uint(f[3]), 0x7632);
    }
}

// A warp multiplies TW row tiles (each x fragment it loads feeds both tiles' MMAs; 2 where C allows) over CW = C / TW
// chunks; the block's 8 warps are 4 / TW row groups x KP = 2 TW parts of the slice. From C alone, never from the
// column tiles: the parts fix the order of a row's sums (4 tiles per warp at two column tiles gave a row other
// bits at 16 vectors than at 1).
template <int C> struct WarpShape {
    static constexpr int kTW = C >= 2 ? 2 : 1;
    static constexpr int kCW = C / kTW;
    static constexpr int kKP = 2 * kTW;
    static constexpr int kGroups = 4 / kTW;
};

// Shared memory of one block: x hi and lo [ROWS][SK] bf16 and the squares [ROWS][F4] while
// staging; the KP parts' sums [KP][16][kPartStride] floats after the MMAs (same bytes).
template <typename W, int C, int NT> struct Smem {
    static constexpr int kRows = NT * 8;                  // vectors staged
    static constexpr int kSlice = 2 * C * kChunk<W>;      // k per block
    static constexpr int kStride = kSlice + 8;            // bf16 per staged row: 16 bytes of padding
                                                          // make the fragment loads conflict-free
    static constexpr int kF4 = kSlice / 4;                // float4s per row of the slice
    static constexpr size_t kX = (size_t)kRows * kStride * 2;  // bytes of hi (and of lo)
    static constexpr size_t kStage = 2 * kX + (size_t)kRows * kF4 * 4;
    static constexpr size_t kPart = (size_t)WarpShape<C>::kKP * kMaxCols * kPartStride * 4;
    static constexpr size_t kBytes = kStage > kPart ? kStage : kPart;
};

// The finished sum of vector col, row `row` of the matrix: RMS scale, row scale, then the mode.
// SWIGLU pairs rows (row, row + 1) of lanes (l, l ^ 1): every lane of the warp calls it.
template <typename W, int MODE>
__device__ __forceinline__ void store_sum(float s, float rms, float ws, int col, int row, int nb, int n_rows,
                                          const float* __restrict__ bias, float* __restrict__ y) {
    float v = __fmul_rn(s, rms);  // not contracted into the bias or residual add
    if (row_scaled<W>()) v = __fmul_rn(v, ws);
    if (MODE == Q3T_GEMV_SWIGLU) {
        const float up = __shfl_xor_sync(0xffffffffu, v, 1);  // row + 1 is the next lane's
        if (row % 2 == 0 && col < nb && row < n_rows) {
            const int n_out = n_rows / 2;
            y[(size_t)col * n_out + row / 2] = (v / (1.0f + expf(-v))) * up;  // silu in float32, as torch
        }
    } else if (col < nb && row < n_rows) {
        float* out = y + (size_t)col * n_rows + row;
        if (MODE == Q3T_GEMV_ADD) *out = __ldcg(out) + v;
        else *out = bias ? v + bias[row] : v;
    }
}

__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// CL: split K across the blocks of a cluster (gridDim.y = ks_count <= 8 blocks per cluster, sm_90). MG: more than
// one group of 16 vectors (nb > 16); without it the loop runs once and the weights' registers are free after the
// MMAs. With it they stay live through each group's sums: at two blocks per SM (128 registers) that spilled 4-20
// bytes in 9 of its 36 kernels (ptxas -v, sm_90), so those kernels take one block per SM (160-168 registers, no
// spill). Reloading each later group's weights from L2 instead spilled more (up to 100 bytes).
template <typename W, int MODE, int C, int NT, bool CL, bool MG>
__global__ void __launch_bounds__(kThreads, MG ? 1 : 2)
    k_bgemv_mma(const W* __restrict__ w, const float* __restrict__ w_scale, int n_rows, int k, int ks_count,
                const float* __restrict__ x, int nb, const float* __restrict__ norm_w, float eps,
                const float* __restrict__ bias, float* __restrict__ y, float* __restrict__ scratch) {
    using S = Smem<W, C, NT>;
    constexpr int V = kLoadK<W>, CK = kChunk<W>;
    constexpr int ROWS = S::kRows, SK = S::kStride, F4 = S::kF4;
    constexpr int PER = ROWS * F4 / kThreads;  // float4s of x a thread stages (F4 divides 256: its f is fixed)
    static_assert(ROWS * F4 % kThreads == 0 && kThreads % F4 == 0, "staging layout");
    constexpr int OUT = ROWS * kTileRows / kThreads;  // (vector, row) sums per thread
    extern __shared__ uint4 smem4[];
    uint16_t* xh = reinterpret_cast<uint16_t*>(smem4);
    uint16_t* xl = xh + ROWS * SK;
    float* sq = reinterpret_cast<float*>(xl + ROWS * SK);
    float* part = reinterpret_cast<float*>(smem4);
    __shared__ float ss_s[kMaxCols], scale_s[kMaxCols];
    __shared__ int last_s;

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, t = lane % 4;
    using WS = WarpShape<C>;
    constexpr int TW = WS::kTW, CW = WS::kCW, KP = WS::kKP;
    const int rg = warp % WS::kGroups, kp = warp / WS::kGroups;  // the warp's row group and part of the slice
    const int tile = blockIdx.x, ks = blockIdx.y;
    const int k0 = ks * S::kSlice;  // the block's first k
    const int rw = rg * 16 * TW;    // the warp's first row in the tile

    // Weights never change: all of the lane's loads go out before the wait. wr[u][e][i]: row tile u, rows g
    // (e = 0) and g + 8 (e = 1), chunk i.
    const W* wp[TW][2];
    bool live[TW][2];
#pragma unroll
    for (int u = 0; u < TW; ++u) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int r = tile * kTileRows + rw + 16 * u + 8 * e + g;
            live[u][e] = r < n_rows;
            wp[u][e] = w + (size_t)(live[u][e] ? r : 0) * k;
        }
    }
    uint4 wr[TW][2][CW];
#pragma unroll
    for (int i = 0; i < CW; ++i) {
        const int kk = k0 + (kp * CW + i) * CK + V * t;
#pragma unroll
        for (int u = 0; u < TW; ++u) {
#pragma unroll
            for (int e = 0; e < 2; ++e) wr[u][e][i] = make_uint4(0, 0, 0, 0);
        }
        // Nested, not one test of kk < k && live: with the one test ptxas sank most loads below the wait (SASS test).
        if (kk < k) {
#pragma unroll
            for (int u = 0; u < TW; ++u) {
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (live[u][e]) wr[u][e][i] = *reinterpret_cast<const uint4*>(wp[u][e] + kk);
            }
        }
    }
    const int f = tid % F4, kf = k0 + 4 * f;  // this thread's float4 of the slice, the same for every row
    float4 gv = make_float4(1.f, 1.f, 1.f, 1.f);
    if (norm_w && kf < k) gv = *reinterpret_cast<const float4*>(norm_w + kf);
    // The scale of the row whose sums this thread finishes (idx % 64 = tid % 64 for each of its sums).
    const int ws_row = tile * kTileRows + tid % kTileRows;
    const float ws = row_scaled<W>() && ws_row < n_rows ? w_scale[ws_row] : 1.f;
    // The cluster path finishes rows lane and lane + 32 of the tile (its warps take 32 sums at a time).
    // Two scalars, not an array: a run-time index into one put it in local memory.
    float ws_lo = 1.f, ws_hi = 1.f;
    if (CL && row_scaled<W>()) {
        const int r = tile * kTileRows + lane;
        if (r < n_rows) ws_lo = w_scale[r];
        if (r + 32 < n_rows) ws_hi = w_scale[r + 32];
    }

    // Behind a branch on an argument (k > 0 always holds), so ptxas keeps the loads above the wait.
    if (k > 0) q3t_grid_dep();

    // Groups of 16 vectors in turn, each exactly as a launch of its 16 alone (the same staging, MMAs, parts and
    // split-K sums), on the weights already in registers: past 16 vectors the matrix is read once, not once per 16.
    const size_t y_row = MODE == Q3T_GEMV_SWIGLU ? (size_t)n_rows / 2 : (size_t)n_rows;
    const int groups = MG ? (nb + kMaxCols - 1) / kMaxCols : 1;
    for (int group = 0; group < groups; ++group) {
        const int nbg = nb - group * kMaxCols < kMaxCols ? nb - group * kMaxCols : kMaxCols;
        const float* xg = x + (size_t)group * kMaxCols * k;
        float* yg = y + (size_t)group * kMaxCols * y_row;
        if (group > 0) __syncthreads();  // the previous group's last reads of shared memory (part, scale_s)
        // Stage the slice of x: rows b = tid / F4 + j * (256 / F4); rows past nb and k past the end are 0.
        // All of a thread's loads in flight at once (one round trip to L2). The products and sums are
        // written with _rn intrinsics: nvcc may contract a * b - c or a * a + s into an FMA in one
        // instantiation (column tiles, C) and not in another, which would change a vector's bits with nb.
        float4 v[PER];
    #pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int b = tid / F4 + j * (kThreads / F4);
            v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (b < nbg && kf < k) v[j] = __ldcg(reinterpret_cast<const float4*>(xg + (size_t)b * k + kf));
        }
    #pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int b = tid / F4 + j * (kThreads / F4);
            const float4 a = v[j];
            uint2 hi, lo;
            split_bf16(make_float4(__fmul_rn(a.x, gv.x), __fmul_rn(a.y, gv.y), __fmul_rn(a.z, gv.z), __fmul_rn(a.w, gv.w)),
                       hi, lo);
            *reinterpret_cast<uint2*>(xh + b * SK + 4 * f) = hi;
            *reinterpret_cast<uint2*>(xl + b * SK + 4 * f) = lo;
            if (norm_w)
                sq[b * F4 + f] = __fmaf_rn(a.w, a.w, __fmaf_rn(a.z, a.z, __fmaf_rn(a.y, a.y, __fmul_rn(a.x, a.x))));
        }
        __syncthreads();
        if (norm_w) {  // the slice's sum of squares per row, in a fixed order
            for (int b = warp; b < ROWS; b += kThreads / 32) {
                float s = 0.f;
                for (int i = lane; i < F4; i += 32) s += sq[b * F4 + i];
                s = warp_sum(s);
                if (lane == 0) ss_s[b] = s;
            }
        }

        float acc[TW][NT][4];
    #pragma unroll
        for (int u = 0; u < TW; ++u)
    #pragma unroll
            for (int j = 0; j < NT; ++j) acc[u][j][0] = acc[u][j][1] = acc[u][j][2] = acc[u][j][3] = 0.f;
    #pragma unroll
        for (int i = 0; i < CW; ++i) {
            const int kl = (kp * CW + i) * CK + V * t;
            uint32_t a[TW][2][V / 2];  // row tile u's rows g and g + 8
    #pragma unroll
            for (int u = 0; u < TW; ++u) {
    #pragma unroll
                for (int e = 0; e < 2; ++e) bf16_pairs<W>(wr[u][e][i], a[u][e]);
            }
    #pragma unroll
            for (int j = 0; j < NT; ++j) {
    #pragma unroll
                for (int h = 0; h < V / 8; ++h) {  // 8 k of the load: two MMAs' k-halves, x rounded hi and lo
                    const uint4 bh = *reinterpret_cast<const uint4*>(xh + (8 * j + g) * SK + kl + 8 * h);
                    const uint4 bl = *reinterpret_cast<const uint4*>(xl + (8 * j + g) * SK + kl + 8 * h);
    #pragma unroll
                    for (int u = 0; u < TW; ++u) {
                        const uint32_t* p = a[u][0] + 4 * h;
                        const uint32_t* q = a[u][1] + 4 * h;
                        mma_bf16(acc[u][j], p[0], q[0], p[1], q[1], bh.x, bh.y);
                        mma_bf16(acc[u][j], p[0], q[0], p[1], q[1], bl.x, bl.y);
                        mma_bf16(acc[u][j], p[2], q[2], p[3], q[3], bh.z, bh.w);
                        mma_bf16(acc[u][j], p[2], q[2], p[3], q[3], bl.z, bl.w);
                    }
                }
            }
        }
        __syncthreads();  // x is read by every warp: part takes its bytes only now
    #pragma unroll
        for (int u = 0; u < TW; ++u) {
    #pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int col = 8 * j + 2 * t, row = rw + 16 * u + g;
                float* p = part + (kp * kMaxCols + col) * kPartStride + row;
                p[0] = acc[u][j][0];
                p[kPartStride] = acc[u][j][1];
                p[8] = acc[u][j][2];
                p[kPartStride + 8] = acc[u][j][3];
            }
        }
        __syncthreads();

        // Thread o-th sum: vector idx / 64, row idx % 64 of the tile (idx = tid + 256 o); the slice's parts in order.
        float s[OUT];
    #pragma unroll
        for (int o = 0; o < OUT; ++o) {
            const int idx = tid + o * kThreads, col = idx / kTileRows, row = idx % kTileRows;
            s[o] = part[col * kPartStride + row];
    #pragma unroll
            for (int q = 1; q < KP; ++q) s[o] = __fadd_rn(s[o], part[(q * kMaxCols + col) * kPartStride + row]);
        }
        float ss = (norm_w && tid < ROWS) ? ss_s[tid] : 0.f;
        if (CL) {
    #if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            __shared__ float rec_s[kRecord];
    #pragma unroll
            for (int o = 0; o < OUT; ++o) rec_s[tid + o * kThreads] = s[o];
            if (tid < ROWS) rec_s[kMaxCols * kTileRows + tid] = ss;
            namespace cg = cooperative_groups;
            cg::cluster_group cluster = cg::this_cluster();
            cluster_barrier();  // every block's record written and visible to the cluster
            const float* recs[kClusterMax];
    #pragma unroll
            for (int q = 0; q < kClusterMax; ++q) recs[q] = cluster.map_shared_rank(rec_s, q < ks_count ? q : 0);
            // 32 sums per warp at a time: units u = 32 sums of vector u / 2, rows 32 (u % 2) + lane; block ks takes
            // units ks, ks + ks_count, ... (its warps in turn); units of vectors past nb are skipped.
            const int units = 2 * (nbg < ROWS ? nbg : ROWS);
            for (int u = ks + ks_count * warp; u < units; u += ks_count * (kThreads / 32)) {
                const int col = u / 2, row = 32 * (u % 2) + lane, idx = col * kTileRows + row;
                float r[kClusterMax], rs[kClusterMax];
    #pragma unroll
                for (int q = 0; q < kClusterMax; ++q) {
                    r[q] = q < ks_count ? recs[q][idx] : 0.f;
                    rs[q] = q < ks_count && norm_w ? recs[q][kMaxCols * kTileRows + col] : 0.f;
                }
                float sum = 0.f, sq_sum = 0.f;  // in ks order, as the scratch path
    #pragma unroll
                for (int q = 0; q < kClusterMax; ++q) {
                    if (q < ks_count) {
                        sum = __fadd_rn(sum, r[q]);
                        sq_sum = __fadd_rn(sq_sum, rs[q]);
                    }
                }
                const float rms = norm_w ? rsqrtf(sq_sum / (float)k + eps) : 1.f;
                store_sum<W, MODE>(sum, rms, u % 2 ? ws_hi : ws_lo, col, tile * kTileRows + row, nbg, n_rows, bias, yg);
            }
            cluster_barrier();  // no block goes on (to the next group's record, or leaves) while another may still read
    #endif
            continue;
        }
        if (ks_count > 1) {
            unsigned* counters = reinterpret_cast<unsigned*>(scratch);
            // Each group its own counter and records: a block may run ahead into the next group while the last
            // block of this one still gathers.
            const int tiles = gridDim.x, slot = group * tiles + tile;
            float* records = scratch + kCounters;
            float* rec = records + ((size_t)slot * ks_count + ks) * kRecord;
    #pragma unroll
            for (int o = 0; o < OUT; ++o) rec[tid + o * kThreads] = s[o];
            if (tid < ROWS) rec[kMaxCols * kTileRows + tid] = ss;
            __threadfence();  // this block's record before its count
            __syncthreads();
            if (tid == 0) last_s = atomicAdd(&counters[slot], 1u) == (unsigned)(ks_count - 1);
            __syncthreads();
            if (!last_s) continue;
            __threadfence();
            const float* first = records + (size_t)slot * ks_count * kRecord;
    #pragma unroll
            for (int o = 0; o < OUT; ++o) s[o] = 0.f;
            ss = 0.f;
            // In ks order, whichever block came last; kGather records' loads in flight at once (a loop of
            // one record at a time waits a round trip to L2 per record).
            constexpr int kGather = 4;
            for (int q0 = 0; q0 < ks_count; q0 += kGather) {
                float r[kGather][OUT], rs[kGather];
    #pragma unroll
                for (int q = 0; q < kGather; ++q) {
                    const float* rec_q = first + (size_t)(q0 + q) * kRecord;
                    const bool in = q0 + q < ks_count;
    #pragma unroll
                    for (int o = 0; o < OUT; ++o) r[q][o] = in ? __ldcg(rec_q + tid + o * kThreads) : 0.f;
                    rs[q] = in && tid < ROWS ? __ldcg(rec_q + kMaxCols * kTileRows + tid) : 0.f;
                }
    #pragma unroll
                for (int q = 0; q < kGather; ++q) {
    #pragma unroll
                    for (int o = 0; o < OUT; ++o) s[o] = __fadd_rn(s[o], r[q][o]);
                    ss = __fadd_rn(ss, rs[q]);
                }
            }
            if (tid == 0) counters[slot] = 0;
        }
        if (tid < ROWS) scale_s[tid] = norm_w ? rsqrtf(ss / (float)k + eps) : 1.f;
        __syncthreads();

    #pragma unroll
        for (int o = 0; o < OUT; ++o) {
            const int idx = tid + o * kThreads, col = idx / kTileRows, row = tile * kTileRows + idx % kTileRows;
            store_sum<W, MODE>(s[o], scale_s[col], ws, col, row, nbg, n_rows, bias, yg);
        }
    }
}

inline int cdiv(int a, int b) { return (a + b - 1) / b; }

// The plan of a shape: C chunks per warp (2C 16-byte loads per lane; bf16 2, 4 or 8, int8 1, 2 or 4: the
// same k per block) and ks_count blocks per row tile: the most chunks a lane takes (fewer only for short
// rows, so that no block is mostly empty chunks), then as many splits as k needs. From (dtype, k)
// alone. Halving C further while the grid has fewer than two blocks per SM lost with the cluster split: in
// a captured chain of the CodePredictor's GEMVs (16 positions x 5 layers and its lm_heads, 1.7B shapes,
// H200, kernels/device/bench_gemv_chain.py with C forced) the largest C took 1.774 -> 1.515 ms at 8
// vectors and 2.267 -> 2.098 at 16, and the Talker's 28 layers stayed within 2 % (1.351 / 1.828 ->
// 1.376 / 1.812): fewer, longer blocks, each lane's 2C loads in flight before the wait, and the small
// CodePredictor grids' splits summed in a cluster.
struct Plan {
    int c, ks;
};
Plan plan_for(int dtype, int k) {
    const int chunk = dtype == Q3T_I8 ? kChunk<int8_t> : kChunk<uint16_t>;
    const int c_max = dtype == Q3T_I8 ? kMaxC<int8_t> : kMaxC<uint16_t>, c_min = c_max / 4;
    const int chunks = cdiv(k, chunk);
    int c = c_max;
    while (c > c_min && chunks <= c) c /= 2;  // short rows: no block of mostly empty chunks
    return Plan{c, cdiv(chunks, 2 * c)};
}

// Whether a plan's row tiles run as clusters: sm_90+, 2..8 blocks (the portable cluster size), a grid of at most
// two blocks per SM, and not turned off (q3t_set_gemv_clusters(0): the A/B against the scratch path).
// Larger grids lost with clusters (ncu, H200: the CodePredictor's qkv at 512 blocks 8.2 -> 9.7 us, its
// gate_up at 384 9.3 -> 10.8), small ones won (its o at 128 blocks 7.6 -> 6.4, down at 96 8.2 -> 7.2).
bool clustered(Plan p, int n_rows) {
    const int blocks = cdiv(n_rows, kTileRows) * p.ks;
    return q3t_gemv_cluster_enabled() && q3t_host_cc_major() >= 9 && p.ks >= 2 && p.ks <= kClusterMax &&
           blocks <= 2 * q3t_host_sms();
}

template <typename W, int MODE, int C, int NT, bool MG>
int launch(const W* w, const float* w_scale, int n_rows, int k, Plan p, const float* x, int nb, const float* norm_w,
           float eps, const float* bias, float* y, float* scratch, cudaStream_t s) {
    const dim3 grid(cdiv(n_rows, kTileRows), p.ks);
    if (!clustered(p, n_rows)) {
        q3t_launch(k_bgemv_mma<W, MODE, C, NT, false, MG>, grid, kThreads, Smem<W, C, NT>::kBytes, s, w, w_scale, n_rows,
                   k, p.ks, x, nb, norm_w, eps, bias, y, scratch);
        return q3t_check_launch("q3t_batched_gemv (tensor cores)");
    }
    q3t_launch_clusters(k_bgemv_mma<W, MODE, C, NT, true, MG>, grid, p.ks, kThreads, Smem<W, C, NT>::kBytes, s, w, w_scale,
                        n_rows, k, p.ks, x, nb, norm_w, eps, bias, y, scratch);
    return q3t_check_launch("q3t_batched_gemv (tensor cores, clusters)");
}

template <typename W, int MODE, int NT, bool MG>
int launch_c(const W* w, const float* w_scale, int n_rows, int k, Plan p, const float* x, int nb,
             const float* norm_w, float eps, const float* bias, float* y, float* scratch, cudaStream_t s) {
    constexpr int C = kMaxC<W>;
    if (p.c == C) return launch<W, MODE, C, NT, MG>(w, w_scale, n_rows, k, p, x, nb, norm_w, eps, bias, y, scratch, s);
    if (p.c == C / 2)
        return launch<W, MODE, C / 2, NT, MG>(w, w_scale, n_rows, k, p, x, nb, norm_w, eps, bias, y, scratch, s);
    return launch<W, MODE, C / 4, NT, MG>(w, w_scale, n_rows, k, p, x, nb, norm_w, eps, bias, y, scratch, s);
}

template <typename W, int MODE>
int launch_mode(const W* w, const float* w_scale, int n_rows, int k, Plan p, const float* x, int nb,
                const float* norm_w, float eps, const float* bias, float* y, float* scratch, cudaStream_t s) {
    if (nb <= 8) return launch_c<W, MODE, 1, false>(w, w_scale, n_rows, k, p, x, nb, norm_w, eps, bias, y, scratch, s);
    if (nb <= kMaxCols)
        return launch_c<W, MODE, 2, false>(w, w_scale, n_rows, k, p, x, nb, norm_w, eps, bias, y, scratch, s);
    return launch_c<W, MODE, 2, true>(w, w_scale, n_rows, k, p, x, nb, norm_w, eps, bias, y, scratch, s);
}

template <typename W>
int launch_dtype(const void* w, const float* w_scale, int n_rows, int k, Plan p, const float* x, int nb,
                 const float* norm_w, float eps, const float* bias, float* y, int mode, float* scratch,
                 cudaStream_t s) {
    const W* wp = static_cast<const W*>(w);
    switch (mode) {
        case Q3T_GEMV_STORE:
            return launch_mode<W, Q3T_GEMV_STORE>(wp, w_scale, n_rows, k, p, x, nb, norm_w, eps, bias, y, scratch, s);
        case Q3T_GEMV_ADD:
            return launch_mode<W, Q3T_GEMV_ADD>(wp, w_scale, n_rows, k, p, x, nb, norm_w, eps, bias, y, scratch, s);
        default:
            return launch_mode<W, Q3T_GEMV_SWIGLU>(wp, w_scale, n_rows, k, p, x, nb, norm_w, eps, bias, y, scratch, s);
    }
}

}  // namespace

bool q3t_batched_gemv_mma_usable(int dtype, int n_rows) {
    return (dtype == Q3T_BF16 || dtype == Q3T_I8) && q3t_host_cc_major() >= 8 &&
           cdiv(n_rows, kTileRows) * kGroups <= kCounters;
}

size_t q3t_batched_gemv_mma_scratch_floats(int dtype, int n_rows, int k) {
    const Plan p = plan_for(dtype, k);
    return p.ks > 1 ? (size_t)kCounters + (size_t)kGroups * cdiv(n_rows, kTileRows) * p.ks * kRecord : 0;
}

int q3t_batched_gemv_mma(int dtype, const void* w, const float* w_scale, int n_rows, int k, const float* x, int nb,
                         const float* norm_w, float eps, const float* bias, float* y, int mode, float* scratch,
                         cudaStream_t s) {
    const Plan p = plan_for(dtype, k);
    if (dtype == Q3T_I8)
        return launch_dtype<int8_t>(w, w_scale, n_rows, k, p, x, nb, norm_w, eps, bias, y, mode, scratch, s);
    return launch_dtype<uint16_t>(w, w_scale, n_rows, k, p, x, nb, norm_w, eps, bias, y, mode, scratch, s);
}

#endif  // Q3T_CUDA
