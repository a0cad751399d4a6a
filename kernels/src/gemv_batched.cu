// q3t_batched_gemv: one weight matrix times nb <= 16 input vectors (one per stream of a batched
// decode step), each weight row read from memory once for all of them: y[b] (mode) W @ xn[b],
// with the modes, the fused RMSNorm (one per vector) and the dtypes of q3t_gemv. More vectors (up to
// Q3T_BATCH_MAX) go through this FMA kernel 16 at a time, one launch each (its accumulators and staged x
// are sized for 16), so the matrix is read once per 16 vectors; the tensor-core kernel
// (gemv_batched_mma.cu, CUDA) takes all of them in one launch. A vector's bits do not change (row
// independence).
//
// Layout. A block of 256 threads takes per_block = (warps / splits) * R units (a row, or a gate/up
// row pair for SwiGLU). The `splits` warps of a unit group take interleaved 16-byte chunks of its
// rows (chunk c to lane c % (splits * warp)), so each warp reads whole 512-byte runs. Each warp holds
// R units, so every x value it reads from shared memory feeds R * (rows per unit) weight rows: shared
// memory gives an SM 32 floats per clock against 128 FMAs, so about 4 rows per x value keep the FMAs,
// not the x reads, the limit at nb = 16.
// x goes through shared memory in tiles of K, as much of it at once as fits (on CUDA the opt-in
// shared memory holds all of x for k <= ~3,500 at nb = 16, so most shapes stage it once). Every block
// reads all of x from L2, nb * k * 4 bytes, which is 2 nb / (rows per block) times its weight bytes:
// hence few splits (rows per block: 8 warps / splits * R * rows per unit, 32 at splits 1) and more
// splits only where the rows are too few to give every SM a block.
// Each lane keeps a ring of P chunks of weight loads in flight (P * rows per lane = 8), running
// ahead across tiles; the first P go out before the kernel waits for its predecessor (PDL).
// RMSNorm: x is staged as it is (its sum of squares taken on the way, in fixed segments), norm_w
// multiplies the widened weights (once per weight, for all nb vectors), the RMS scale the sums.
// int8 weights (Q3T_I8): 16 to a 16-byte chunk (bf16: 8), widened exactly in registers like bf16's;
// each row's scale multiplies its finished sum after the RMS scale.
//
// Row independence (q3t.h): the order in which one vector's products are summed is fixed by
// (n_rows, k, dtype, mode) and the device (SM count, warp width), never by nb, the other vectors or
// the tile size: each lane adds its chunks in ascending order, weight by weight; the lanes of a warp
// meet in warp_sum's butterfly (warp_reduce_scatter below keeps that tree), the split warps in a fixed
// order; the sum of squares goes in fixed segments of a float4 per lane (warp_sum each, then in
// order). `splits` is chosen for the 16-vector kernel whatever nb is (host, below). So a vector's
// outputs are the same bits at nb = 1 and in any batch. They are not q3t_gemv's bits (it sums in
// another order); the two agree to float32 rounding (tests/test_batched_kernels_gpu.py).
#include "common.cuh"


namespace {

constexpr int kThreads = 256;
constexpr int kMaxNB = 16;
constexpr int kMaxLoads = 8;             // 16-byte weight loads in flight per lane (ring depth * rows per lane)
constexpr int kPortableSmem = 40 * 1024;  // dynamic shared memory without opt-in (HIP: always)

template <typename W> using Pack = WeightVec16<W>;

// Weights 4q..4q+3 of a 16-byte load as float32 (int8: q = 0..3; bf16: q = 0, 1; float32: q = 0).
template <typename W> __device__ __forceinline__ void widen4(const uint4& u, int q, float (&f)[4]);
template <> __device__ __forceinline__ void widen4<float>(const uint4& u, int, float (&f)[4]) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
}
template <> __device__ __forceinline__ void widen4<int8_t>(const uint4& u, int q, float (&f)[4]) {
    i8x4_to_f32(q == 0 ? u.x : q == 1 ? u.y : q == 2 ? u.z : u.w, f);
}
template <> __device__ __forceinline__ void widen4<uint16_t>(const uint4& u, int q, float (&f)[4]) {
    const uint32_t a = q ? u.z : u.x, b = q ? u.w : u.y;
    f[0] = bf16_lo(a);
    f[1] = bf16_hi(a);
    f[2] = bf16_lo(b);
    f[3] = bf16_hi(b);
}

// Weight rows per lane (x reuse) at most, for NB vectors: enough that the FMAs, not the shared-memory
// reads of x, bound the kernel at large NB, few enough that NB * rows accumulators fit the registers.
template <int NB> constexpr int max_weight_rows() { return NB >= 4 ? 4 : NB; }
template <int NB, int NR> constexpr int max_units() { return max_weight_rows<NB>() / NR > 1 ? max_weight_rows<NB>() / NR : 1; }
// Chunks of weight loads a lane keeps in flight.
template <int RW> __host__ __device__ constexpr int ring() { return kMaxLoads / RW > 1 ? kMaxLoads / RW : 1; }

// Blocks per SM the kernel asks registers for: two (so one block's x staging overlaps the other's
// FMAs), one where the NB * R * rows-per-unit accumulators or the NB x values in flight would spill
// at the 128 registers two blocks leave each thread (ptxas -v, sm_90). int8 widens 16 weights a chunk
// where bf16 widens 8, and spilled a few bytes at 128 from 16 accumulators (nb 8, two rows a lane) on.
template <typename W, int MODE, int NB, int R>
constexpr int min_blocks() {
    const int accumulators = NB * R * (MODE == Q3T_GEMV_SWIGLU ? 2 : 1);
    return NB >= 16 || accumulators >= (sizeof(W) == 1 ? 16 : 32) ? 1 : 2;
}

// The butterfly of warp_sum over each of M values (M a power of two), as a reduce-scatter: at each
// of the first log2(M) masks a lane keeps half of its values and sends the other half, so the warp
// spends M - M / warp shuffles instead of 5 M. Value e's partial sums meet in exactly warp_sum's
// tree (mask warp/2 first, down to 1), so each result is warp_sum's, bit for bit. A recursion over
// the masks, so that every array index is a compile-time constant (registers, no local memory).
template <int M, int CNT, int MASK>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[M], int lane, int& base) {
    if constexpr (MASK > 0) {
        if constexpr (CNT >= 2) {
            constexpr int half = CNT / 2;
            const bool up = (lane & MASK) != 0;
#pragma unroll
            for (int i = 0; i < half; ++i) {
                // Both read into scalars first: a select between two array elements makes clang keep
                // the array in scratch memory.
                const float lo = v[i], hi = v[i + half];
                v[i] = (up ? hi : lo) + Q3T_SHFL_XOR(up ? lo : hi, MASK);
            }
            if (up) base += half;
            reduce_scatter_step<M, half, MASK / 2>(v, lane, base);
        } else {
            v[0] += Q3T_SHFL_XOR(v[0], MASK);
            reduce_scatter_step<M, 1, MASK / 2>(v, lane, base);
        }
    }
}

// Afterwards each value's total is written to out[e] by one lane.
template <int M>
__device__ __forceinline__ void warp_reduce_scatter(float (&v)[M], float* out) {
    static_assert((M & (M - 1)) == 0, "M must be a power of two");
    const int lane = threadIdx.x % Q3T_WARP;
    int base = 0;  // index of v[0] among the M
    reduce_scatter_step<M, M, Q3T_WARP / 2>(v, lane, base);
    constexpr int held = M >= Q3T_WARP ? M / Q3T_WARP : 1;
    // With M < warp, the lanes that differ only in the low bits (the plain butterfly steps) hold copies.
    if (M >= Q3T_WARP || (lane & (Q3T_WARP / M - 1)) == 0) {
#pragma unroll
        for (int i = 0; i < held; ++i) out[base + i] = v[i];
    }
}

template <typename W, int MODE, int NB, int R>
__global__ void __launch_bounds__(kThreads, (min_blocks<W, MODE, NB, R>()))
    k_bgemv(const W* __restrict__ w, const float* __restrict__ w_scale, int n_out, int k, int splits, int d,
            const float* __restrict__ x, int nb,
            const float* __restrict__ norm_w, float eps, const float* __restrict__ bias, float* __restrict__ y) {
    constexpr int NR = MODE == Q3T_GEMV_SWIGLU ? 2 : 1;  // weight rows per unit
    constexpr int RW = R * NR;                           // weight rows per lane
    constexpr int M = NB * RW;                           // accumulators per lane: acc[b * RW + rr]
    constexpr int P = ring<RW>();
    constexpr int V = Pack<W>::N;
    constexpr int NW = kThreads / Q3T_WARP;
    constexpr int SEG = 4 * Q3T_WARP;  // floats of one sum-of-squares segment (a float4 per lane)
    constexpr int kStage = M >= 16 ? 4 : 8;  // float4 loads of x in flight per lane while staging
    constexpr int kOut = (NW * R * NB + kThreads - 1) / kThreads;  // outputs per thread at most
    // Quarters (4 weights) of a chunk widened per round of the loop below: two, and one for int8 at 64
    // accumulators (nb 16 at four rows a lane), which spilled a few VGPRs on RDNA with two.
    constexpr int kRound = sizeof(W) == 1 && M >= 64 ? 1 : 2;
    // Dynamic shared memory: x [NB][T], then norm_w [T], then the segment sums of squares [NB][T / SEG].
    extern __shared__ float4 sm4[];
    __shared__ float part[NW][M];  // each warp's reduced sums
    __shared__ float scale_s[NB];
    const int tid = threadIdx.x, lane = tid % Q3T_WARP, warp = tid / Q3T_WARP;
    const int per_block = (NW / splits) * R;
    const int unit0 = blockIdx.x * per_block + (warp / splits) * R;
    const int lanes = splits * Q3T_WARP;                 // lanes over one row: a lane's chunk stride
    const int first = (warp % splits) * Q3T_WARP + lane;  // this lane's first chunk
    const int nvec = k / V;
    const int cmax = (nvec + lanes - 1) / lanes;  // chunks of the busiest lane
    const int T = d * lanes * V;                  // floats of x per row and tile
    const int tiles = (cmax + d - 1) / d;
    // x's and norm_w's tiles padded for bf16 and int8 (common.cuh, xs_at: lanes read them 32 or 64 bytes
    // apart): float4 f of a tile at f + f / 8, a row TP4 float4s long (T is a multiple of 256).
    constexpr bool PAD = xs_padded<W>();
    const int TP4 = PAD ? T / 4 + T / 32 : T / 4;
    float4* xs4 = sm4;
    float4* gs4 = sm4 + (size_t)NB * TP4;
    float* segp = reinterpret_cast<float*>(gs4 + TP4);

    const W* rows[RW];
    bool live[RW];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
        const int unit = unit0 + rr / NR;
        live[rr] = unit < n_out;
        rows[rr] = w + (size_t)(NR * (live[rr] ? unit : 0) + rr % NR) * k;
    }

    // Weights never change: the ring's first loads go out before waiting for the previous kernel.
    uint4 wb[P][RW];
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const int c = first + p * lanes;
#pragma unroll
        for (int rr = 0; rr < RW; ++rr)
            wb[p][rr] = (c < nvec && live[rr]) ? reinterpret_cast<const uint4*>(rows[rr])[c] : make_uint4(0, 0, 0, 0);
    }
    // Behind a branch on an argument (k > 0 always holds), so ptxas keeps the loads above the wait
    // (as in gemv_splitk.cu). The residual-add values go out right after it.
    float y_old[kOut];
#pragma unroll
    for (int i = 0; i < kOut; ++i) y_old[i] = 0.f;
    if (k > 0) {
        q3t_grid_dep();
        if (MODE == Q3T_GEMV_ADD) {
#pragma unroll
            for (int i = 0; i < kOut; ++i) {
                const int o = tid + i * kThreads, b = o / per_block, unit = blockIdx.x * per_block + o % per_block;
                if (b < nb && unit < n_out) y_old[i] = y[(size_t)b * n_out + unit];
            }
        }
    }

    float acc[M];
#pragma unroll
    for (int e = 0; e < M; ++e) acc[e] = 0.f;
    float ss = 0.f;  // thread b < NB: row b's sum of squares so far
    const float4* xv = reinterpret_cast<const float4*>(x);
    const float4* gv = reinterpret_cast<const float4*>(norm_w);
    int j = 0;  // the lane's next chunk: c = first + j * lanes
    for (int t = 0; t < tiles; ++t) {
        if (t > 0) __syncthreads();  // every warp is done with the previous tile
        // Stage x[:, lo:lo+n) as (row, segment) items, a warp each, kStage per lane in flight; norm_w's
        // tile beside it. Rows past nb are zeros.
        const int lo = t * T, n = min(k - lo, T), nseg = (n + SEG - 1) / SEG, items = NB * nseg;
        if (gv)
            for (int f = tid; 4 * f < n; f += kThreads) gs4[PAD ? f + (f >> 3) : f] = gv[lo / 4 + f];
        for (int i0 = warp; i0 < items; i0 += kStage * NW) {
            float4 a[kStage];
#pragma unroll
            for (int q = 0; q < kStage; ++q) {
                const int i = i0 + q * NW, b = i / nseg, f = (i % nseg) * Q3T_WARP + lane;  // f: float4 in the tile
                // A value, not a named zero, on the false side: `c ? xv[i] : zero4` selects between two
                // lvalues, i.e. two addresses, and hipcc then keeps zero4 in scratch memory.
                a[q] = (i < items && 4 * f < n && b < nb) ? xv[((size_t)b * k + lo) / 4 + f] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int q = 0; q < kStage; ++q) {
                const int i = i0 + q * NW;
                if (i < items) {  // the same for the whole warp
                    const int b = i / nseg, sg = i % nseg, f = sg * Q3T_WARP + lane;
                    const float4 v = a[q];
                    if (4 * f < n) xs4[b * TP4 + (PAD ? f + (f >> 3) : f)] = v;
                    if (gv) {
                        const float sq = warp_sum(v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
                        if (lane == 0) segp[b * nseg + sg] = sq;
                    }
                }
            }
        }
        __syncthreads();
        if (gv && tid < NB)
            for (int sg = 0; sg < nseg; ++sg) ss += segp[tid * nseg + sg];

        // The tile's chunks; each ring slot is refilled with the chunk P ahead as soon as it is used.
        const int jend = min((t + 1) * d, cmax);
        for (; j < jend; ++j) {
            const int c = first + j * lanes, slot = j % P;
            const int at0 = (c - t * d * lanes) * V / 4;  // the chunk's first float4 in the tile
            const int at = PAD ? at0 + (at0 >> 3) : at0;  // where it sits (its float4s stay together)
#pragma unroll
            for (int p = 0; p < P; ++p) {
                if (p == slot) {  // the same for the whole block: one copy of the body per ring slot
                    if (c < nvec) {
                        // kRound quarters of the chunk per round (bf16: all of it): unrolled over int8's four,
                        // clang loads x for all of them up front, NB * 16 floats, and spilled at nb = 16 on RDNA.
#pragma unroll kRound
                        for (int q = 0; q < V / 4; ++q) {
                            float wf[RW][4];
#pragma unroll
                            for (int rr = 0; rr < RW; ++rr) widen4<W>(wb[p][rr], q, wf[rr]);
                            if (gv) {
                                const float4 g = gs4[at + q];
#pragma unroll
                                for (int rr = 0; rr < RW; ++rr) {
                                    wf[rr][0] *= g.x;
                                    wf[rr][1] *= g.y;
                                    wf[rr][2] *= g.z;
                                    wf[rr][3] *= g.w;
                                }
                            }
#pragma unroll
                            for (int b = 0; b < NB; ++b) {
                                const float4 a = xs4[b * TP4 + at + q];
#pragma unroll
                                for (int rr = 0; rr < RW; ++rr) {
                                    float& s = acc[b * RW + rr];
                                    s = fmaf(wf[rr][0], a.x, s);
                                    s = fmaf(wf[rr][1], a.y, s);
                                    s = fmaf(wf[rr][2], a.z, s);
                                    s = fmaf(wf[rr][3], a.w, s);
                                }
                            }
                        }
                    }
                    const int cn = c + P * lanes;
#pragma unroll
                    for (int rr = 0; rr < RW; ++rr)
                        wb[p][rr] = (cn < nvec && live[rr]) ? reinterpret_cast<const uint4*>(rows[rr])[cn] : make_uint4(0, 0, 0, 0);
                }
            }
        }
    }
    // The row scales (int8) of the outputs this thread finishes: loaded here, not with the weights, where
    // they would hold registers through the loop above (ptxas spilled the nb 4 and 8 kernels at 128); the
    // reduction below covers most of their latency.
    float ws[kOut][NR];
#pragma unroll
    for (int i = 0; i < kOut; ++i) {
        const int o = tid + i * kThreads, b = o / per_block, unit = blockIdx.x * per_block + o % per_block;
#pragma unroll
        for (int nr = 0; nr < NR; ++nr)
            ws[i][nr] = row_scaled<W>() && b < nb && unit < n_out ? w_scale[(size_t)NR * unit + nr] : 1.f;
    }
    if (tid < NB) scale_s[tid] = gv ? rsqrtf(ss / (float)k + eps) : 1.f;
    warp_reduce_scatter<M>(acc, part[warp]);
    __syncthreads();

    // One thread per (vector, unit) adds the unit's split warps in order and applies the mode.
#pragma unroll
    for (int i = 0; i < kOut; ++i) {
        const int o = tid + i * kThreads, b = o / per_block, ul = o % per_block;
        const int unit = blockIdx.x * per_block + ul;
        if (b < nb && unit < n_out) {
            const int g0 = (ul / R) * splits, e = b * RW + (ul % R) * NR;
            float sum[NR];
#pragma unroll
            for (int nr = 0; nr < NR; ++nr) {
                float s = 0.f;
                for (int sp = 0; sp < splits; ++sp) s += part[g0 + sp][e + nr];
                sum[nr] = s * scale_s[b];
                if (row_scaled<W>()) sum[nr] = __fmul_rn(sum[nr], ws[i][nr]);  // not contracted into the bias or add
            }
            float* yb = y + (size_t)b * n_out;
            if (MODE == Q3T_GEMV_SWIGLU) {
                const float gt = sum[0], up = sum[NR - 1];
                yb[unit] = (gt / (1.0f + expf(-gt))) * up;  // silu in float32, as torch
            } else if (MODE == Q3T_GEMV_ADD) {
                yb[unit] = y_old[i] + sum[0];
            } else {
                yb[unit] = bias ? sum[0] + bias[unit] : sum[0];
            }
        }
    }
}

inline int cdiv(int a, int b) { return (a + b - 1) / b; }

// Dynamic shared memory a block may use: by a kernel that runs one block per SM, and by one that runs
// two. CUDA: the device's opt-in limit (227 KiB on an H100/H200) less what the kernel's static arrays
// and the runtime reserve per block; HIP: kPortableSmem (LDS is 64 KiB per workgroup).
struct SmemBudget {
    int one_block, two_blocks;
};
SmemBudget smem_budget() {
#if defined(Q3T_CUDA)
    static const SmemBudget budget = [] {
        int dev = 0, per_block = 0, per_sm = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess) {
            (void)cudaGetLastError();  // no answer: the portable budget
            return SmemBudget{kPortableSmem, kPortableSmem};
        }
        constexpr int reserve = 4096;  // static arrays (< 2.2 KiB) and the runtime's share of each block
        const int one = (per_block < per_sm ? per_block : per_sm) - reserve, two = per_sm / 2 - reserve;
        return SmemBudget{one > kPortableSmem ? one : kPortableSmem, two > kPortableSmem ? two : kPortableSmem};
    }();
    return budget;
#else
    return SmemBudget{kPortableSmem, kPortableSmem};
#endif
}

// Shared-memory bytes of a tile of d chunks per lane: x (NB rows), norm_w (both padded for v > 4 weights a
// load, as the kernel's PAD) and the segment sums.
size_t tile_bytes(int nb_rows, int d, int lanes, int v, int warp) {
    const size_t t = (size_t)d * lanes * v, tp = v > 4 ? t + t / 8 : t;
    return (nb_rows * tp + tp + nb_rows * (t / (4 * warp))) * sizeof(float);
}

template <typename W, int MODE, int NB, int R>
int launch_r(const W* w, const float* w_scale, int n_out, int k, int splits, const float* x, int nb, const float* norm_w, float eps,
             const float* bias, float* y, cudaStream_t s) {
    constexpr int V = Pack<W>::N;
    const auto kernel = k_bgemv<W, MODE, NB, R>;
    const int warp = q3t_host_warp(), nwarps = kThreads / warp;
    const SmemBudget sb = smem_budget();
    const int budget = min_blocks<W, MODE, NB, R>() == 1 ? sb.one_block : sb.two_blocks;
#if defined(Q3T_CUDA)
    // Past 48 KiB a kernel must opt in, once.
    static const cudaError_t opted = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, budget);
    if (opted != cudaSuccess) return q3t_fail("q3t_batched_gemv: shared memory opt-in: %s", cudaGetErrorString(opted));
#endif
    // As many chunks per lane in one tile as the budget holds: the whole of x for most shapes.
    const int lanes = splits * warp, cmax = cdiv(k / V, lanes);
    int d = cmax;
    while (d > 1 && tile_bytes(NB, d, lanes, V, warp) > (size_t)budget) d = d > 8 ? d - d / 8 : d - 1;
    const dim3 grid(cdiv(n_out, (nwarps / splits) * R));
    q3t_launch(kernel, grid, kThreads, tile_bytes(NB, d, lanes, V, warp), s, w, w_scale, n_out, k, splits, d, x, nb,
               norm_w, eps, bias, y);
    return q3t_check_launch("q3t_batched_gemv");
}

// Picks the partition and launches. `splits` fixes every vector's order of summation, so it is chosen
// for the 16-vector kernel whatever nb is: 1, doubled while that kernel's grid would leave more than
// a tenth of the SMs without a block (and every lane keeps a chunk, and a tile of one chunk per lane
// fits). R (units per warp) and the tile change no sum's order: R is the most the bucket's registers
// take, halved while the grid would leave SMs idle.
template <typename W, int MODE, int NB>
int launch_nb(const void* w, const float* w_scale, int n_rows, int k, const float* x, int nb, const float* norm_w, float eps,
              const float* bias, float* y, cudaStream_t s) {
    constexpr int NR = MODE == Q3T_GEMV_SWIGLU ? 2 : 1;
    constexpr int V = Pack<W>::N;
    const int n_out = n_rows / NR;
    const int warp = q3t_host_warp(), nwarps = kThreads / warp;
    const int sms = q3t_host_sms() > 0 ? q3t_host_sms() : 1;
    const int fill = sms - sms / 10;
    const int units16 = max_units<kMaxNB, NR>();
    int splits = 1;
    while (2 * splits <= nwarps && k / V >= 2 * splits * warp && cdiv(n_out, (nwarps / splits) * units16) < fill &&
           tile_bytes(kMaxNB, 1, 2 * splits * warp, V, warp) <= (size_t)smem_budget().one_block)
        splits *= 2;
    int r = max_units<NB, NR>();
    while (r > 1 && cdiv(n_out, (nwarps / splits) * r) < fill) r /= 2;
    const W* wp = static_cast<const W*>(w);
    if constexpr (max_units<NB, NR>() >= 4)
        if (r == 4) return launch_r<W, MODE, NB, 4>(wp, w_scale, n_out, k, splits, x, nb, norm_w, eps, bias, y, s);
    if constexpr (max_units<NB, NR>() >= 2)
        if (r == 2) return launch_r<W, MODE, NB, 2>(wp, w_scale, n_out, k, splits, x, nb, norm_w, eps, bias, y, s);
    return launch_r<W, MODE, NB, 1>(wp, w_scale, n_out, k, splits, x, nb, norm_w, eps, bias, y, s);
}

template <typename W, int MODE>
int launch_mode(const void* w, const float* w_scale, int n_rows, int k, const float* x, int nb, const float* norm_w, float eps,
                const float* bias, float* y, cudaStream_t s) {
    // The vector count's bucket: the kernel computes NB rows and stores the first nb.
    if (nb <= 1) return launch_nb<W, MODE, 1>(w, w_scale, n_rows, k, x, nb, norm_w, eps, bias, y, s);
    if (nb <= 2) return launch_nb<W, MODE, 2>(w, w_scale, n_rows, k, x, nb, norm_w, eps, bias, y, s);
    if (nb <= 4) return launch_nb<W, MODE, 4>(w, w_scale, n_rows, k, x, nb, norm_w, eps, bias, y, s);
    if (nb <= 8) return launch_nb<W, MODE, 8>(w, w_scale, n_rows, k, x, nb, norm_w, eps, bias, y, s);
    return launch_nb<W, MODE, 16>(w, w_scale, n_rows, k, x, nb, norm_w, eps, bias, y, s);
}

template <typename W>
int launch_dtype(const void* w, const float* w_scale, int n_rows, int k, const float* x, int nb, const float* norm_w, float eps,
                 const float* bias, float* y, int mode, cudaStream_t s) {
    switch (mode) {
        case Q3T_GEMV_STORE: return launch_mode<W, Q3T_GEMV_STORE>(w, w_scale, n_rows, k, x, nb, norm_w, eps, bias, y, s);
        case Q3T_GEMV_ADD: return launch_mode<W, Q3T_GEMV_ADD>(w, w_scale, n_rows, k, x, nb, norm_w, eps, bias, y, s);
        case Q3T_GEMV_SWIGLU: return launch_mode<W, Q3T_GEMV_SWIGLU>(w, w_scale, n_rows, k, x, nb, norm_w, eps, bias, y, s);
        default: return q3t_fail("q3t_batched_gemv: unknown mode %d", mode);
    }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

extern "C" Q3T_API long long q3t_batched_gemv_scratch_floats(int dtype, int n_rows, int k) {
    if (n_rows <= 0 || k <= 0 || (dtype != Q3T_F32 && dtype != Q3T_BF16 && dtype != Q3T_I8)) {
        q3t_fail("q3t_batched_gemv_scratch_floats: bad arguments (dtype=%d n=%d k=%d)", dtype, n_rows, k);
        return -1;
    }
#if defined(Q3T_CUDA)
    if (q3t_batched_gemv_mma_usable(dtype, n_rows))
        return (long long)q3t_batched_gemv_mma_scratch_floats(dtype, n_rows, k);
#endif
    return 0;
}

extern "C" Q3T_API int q3t_batched_gemv(int dtype, const void* w, const float* w_scale, int n_rows, int k,
                                        const float* x, int nb, const float* norm_w, float eps, const float* bias,
                                        float* y, int mode, float* scratch, long long scratch_floats, void* stream) {
    if (!w || !x || !y || n_rows <= 0 || k <= 0) return q3t_fail("q3t_batched_gemv: bad arguments (n=%d k=%d)", n_rows, k);
    if (nb < 1 || nb > Q3T_BATCH_MAX) return q3t_fail("q3t_batched_gemv: nb=%d, expected 1..%d", nb, Q3T_BATCH_MAX);
    if (dtype != Q3T_F32 && dtype != Q3T_BF16 && dtype != Q3T_I8)
        return q3t_fail("q3t_batched_gemv: unknown dtype %d", dtype);
    if (q3t_check_w_scale("q3t_batched_gemv", dtype, w_scale)) return -1;
    const int v = dtype == Q3T_F32 ? 4 : dtype == Q3T_BF16 ? 8 : 16;  // weights per 16-byte chunk
    if (k % v || !aligned16(w) || !aligned16(x) || !aligned16(norm_w))
        return q3t_fail("q3t_batched_gemv: k=%d must be a multiple of %d and w, x, norm_w 16-byte aligned", k, v);
    if (mode == Q3T_GEMV_SWIGLU && (n_rows % 2))
        return q3t_fail("q3t_batched_gemv: SwiGLU needs an even row count, got %d", n_rows);
    if (mode != Q3T_GEMV_STORE && bias) return q3t_fail("q3t_batched_gemv: bias is only supported with Q3T_GEMV_STORE");
    cudaStream_t s = Q3T_STREAM(stream);
#if !defined(Q3T_CUDA)
    (void)scratch;  // the tensor-core kernel is CUDA's; HIP runs the FMA kernel (gemv_batched_mma.cu says why)
    (void)scratch_floats;
#else
    if (scratch && q3t_batched_gemv_mma_usable(dtype, n_rows)) {
        const long long need = (long long)q3t_batched_gemv_mma_scratch_floats(dtype, n_rows, k);
        if (scratch_floats < need)
            return q3t_fail("q3t_batched_gemv: scratch of %lld floats, %d x %d needs %lld", scratch_floats, n_rows, k, need);
        // All nb vectors in one launch (16 at a time inside each block, on the weights it read once), or with
        // q3t_set_gemv_groups(0) one launch per 16, in order on one stream (the split-K scratch is free again
        // after each).
        const int per_launch = q3t_gemv_groups_enabled() ? nb : 16;
        const size_t y_row = mode == Q3T_GEMV_SWIGLU ? (size_t)n_rows / 2 : (size_t)n_rows;
        for (int b0 = 0; b0 < nb; b0 += per_launch) {
            const int n = nb - b0 < per_launch ? nb - b0 : per_launch;
            const int rc = q3t_batched_gemv_mma(dtype, w, w_scale, n_rows, k, x + (size_t)b0 * k, n, norm_w, eps, bias,
                                                y + (size_t)b0 * y_row, mode, scratch, s);
            if (rc) return rc;
        }
        return 0;
    }
#endif
    const size_t y_row = mode == Q3T_GEMV_SWIGLU ? (size_t)n_rows / 2 : (size_t)n_rows;
    // The FMA kernel: kMaxNB vectors a launch, in order on one stream.
    for (int b0 = 0; b0 < nb; b0 += kMaxNB) {
        const int n = nb - b0 < kMaxNB ? nb - b0 : kMaxNB;
        const float* xb = x + (size_t)b0 * k;
        float* yb = y + (size_t)b0 * y_row;
        int rc;
        if (dtype == Q3T_F32) rc = launch_dtype<float>(w, w_scale, n_rows, k, xb, n, norm_w, eps, bias, yb, mode, s);
        else if (dtype == Q3T_BF16)
            rc = launch_dtype<uint16_t>(w, w_scale, n_rows, k, xb, n, norm_w, eps, bias, yb, mode, s);
        else rc = launch_dtype<int8_t>(w, w_scale, n_rows, k, xb, n, norm_w, eps, bias, yb, mode, s);
        if (rc) return rc;
    }
    return 0;
}
