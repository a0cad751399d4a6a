// q3t_gemv and q3t_gemv_batch on int8 weights with int8 tensor cores (CUDA, sm_80+; one or two input vectors):
// the function of the split-K and row kernels (y (mode) W @ xn, RMSNorm fused, the row's scale after the sum)
// where those spend three instructions a weight widening it to float32 and multiplying (common.cuh,
// WeightVec16<int8_t>), which kept int8 GEMVs at ~77 % of bf16's bytes a second (docs/int8.md).
//
// x as four int8 digits. Each input vector is scaled by a power of two, 2^e, so that its largest |x * norm_w|
// is below 64 (digits4), and written as x' = d0 + d1 / 128 + d2 / 128^2 + d3 / 128^3 with integer digits in [-64, 64]:
// every element to 2^-21 (of a largest element >= 32: ~26 bits where float32 keeps 24; smaller elements keep
// the same absolute step). mma.sync m16n8k32 (s8 x s8 -> s32) takes the digits as operand A (row m: vector
// m / 4 % nb, digit m % 4; the rows past 4 nb repeat them and are not read) and the weights as loaded as
// operand B (column n: one of the warp's 8 rows), so a weight costs no instruction of its own: a lane's
// 16-byte load feeds two MMAs, with one 16-byte shared load of digits. Products and sums are integers, exact
// in int32 (|sum| <= 64 * 127 * 8192 < 2^31), so a row's four digit sums do not depend on the order of the
// additions (the split across warps, the plan, the batch), and each row's result is rounded once:
// (d0 + d1 / 128 + d2 / 128^2 + d3 / 128^3) * 2^-e in double (exact), to float, then the RMS scale and the
// row's scale as the FMA kernels apply them. Not the FMA kernels' bits; closer to the exact product.
//
// Layout. A warp takes 8 rows; lane (g, t) loads the 16 bytes at k = 64 c + 16 t of row g for each chunk c
// (64 k) of its share: operand B of two MMAs (k 16 t .. + 7, then + 8 .. + 15: a fixed permutation of k that
// the digit fragments follow, read at the same 16 t of each digit's plane), so each load instruction reads
// whole 64-byte runs of 8 rows. The `splits` warps of a row group take interleaved chunks; a block of 8
// warps holds 8 / splits row groups. All of a lane's up-front loads (PRE chunks) go out before the kernel
// waits for its predecessor (programmatic dependent launch), as the FMA kernels'; rows of more chunks
// take the rest four at a time.
// Digit planes in shared memory, per vector: chunk c's 256 bytes hold digit 0's 64 bytes, then 1, 2, 3, so
// the 8 lanes of a 16-byte read (t = 0..3 of two digits) meet 32 distinct banks.
#include "common.cuh"

#if defined(Q3T_CUDA)

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 8;    // weight rows of a warp: the MMA's n
constexpr int kChunk = 64;  // k of a chunk: 4 lanes x 16 bytes of a row
constexpr int kMaxPre = 8;  // chunks a lane loads before the wait

// d += A B: A 16 x 32 digits (rows g and g + 8 the same: a0 = a1, a2 = a3), B 32 x 8 weights, s32 sums.
__device__ __forceinline__ void mma_s8(int (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a0), "r"(a2), "r"(a2), "r"(b0), "r"(b1));
#endif
}

// Four elements' four digits (x' = v s, s = 2^e, |x'| < 64: each digit in [-64, 64]): word q holds digit q of
// the four in byte order. Rounding by the magic number M = 1.5 2^23: t = x' + M is round(x') + M exactly (the
// floats there are the integers), its low byte round(x') in two's complement (the mantissa holds 2^22 +
// round(x')), and the rest (x' - round(x')) 128 comes from two FMAs; every step is exact. ~14 instructions an
// element, where rintf and conversions took ~30 (each block turns all of x into digits).
__device__ __forceinline__ void digits4(float4 v, float s, uint32_t (&d)[4]) {
    constexpr float M = 12582912.f;
    float r[4] = {v.x * s, v.y * s, v.z * s, v.w * s};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        uint32_t tb[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float t = r[j] + M;
            tb[j] = __float_as_uint(t);
            if (q < 3) r[j] = fmaf(r[j], 128.f, fmaf(t, -128.f, 128.f * M));  // (x' - round(x')) 128
        }
        d[q] = __byte_perm(__byte_perm(tb[0], tb[1], 0x0040), __byte_perm(tb[2], tb[3], 0x0040), 0x5410);
    }
}

__device__ __forceinline__ uint32_t warp_umax(uint32_t v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

// |v|'s bits: unsigned order is |v|'s order, with inf above every finite value and NaN above inf.
__device__ __forceinline__ uint32_t abs_bits(float4 v) {
    const uint32_t m = 0x7fffffffu;
    return max(max(__float_as_uint(v.x) & m, __float_as_uint(v.y) & m),
               max(__float_as_uint(v.z) & m, __float_as_uint(v.w) & m));
}

__device__ __forceinline__ float4 mul4(float4 a, float4 b) {
    return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}

// Blocks per SM asked of ptxas: with 8 up-front chunks and one vector its own choice was 80 registers and a
// spill; two vectors take ~105 registers.
template <int PRE, int NB>
constexpr int min_blocks() {
    return PRE == kMaxPre || NB == 2 ? 2 : 3;
}

template <int MODE, int PRE, int NB>
__global__ void __launch_bounds__(kThreads, (min_blocks<PRE, NB>()))
    k_gemv_i8mma(const int8_t* __restrict__ w, const float* __restrict__ w_scale, int n_out, int k, int splits,
                 const float* __restrict__ x, const float* __restrict__ norm_w, float eps,
                 const float* __restrict__ bias, float* __restrict__ y) {
    constexpr int NR = MODE == Q3T_GEMV_SWIGLU ? 2 : 1;  // weight rows per output
    extern __shared__ uint32_t planes[];                 // NB vectors x k / 64 chunks x 4 digits x 16 words
    __shared__ float red_ss[NB][kWarps];
    __shared__ uint32_t red_mx[NB][kWarps];
    __shared__ int part[kWarps][4 * NB][kRows];  // each warp's digit sums of its 8 rows
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int groups = kWarps / splits, sw = warp % splits, grp = warp / splits;
    const int n_rows = n_out * NR, nch = k / kChunk;
    const int row = (blockIdx.x * groups + grp) * kRows + g;
    const bool live = row < n_rows;
    const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)(live ? row : 0) * k) + t;  // chunk c at 4 c

    // Weights never change: their loads go out before waiting for the previous kernel.
    uint4 pre[PRE];
#pragma unroll
    for (int j = 0; j < PRE; ++j) {
        const int c = sw + j * splits;
        pre[j] = live && c < nch ? wr[4 * c] : make_uint4(0, 0, 0, 0);
    }
    const int per_block = groups * kRows / NR;  // outputs of the block
    const int mine = (int)(blockIdx.x * per_block + threadIdx.x);
    const bool finisher = (int)threadIdx.x < per_block && mine < n_out;  // this thread writes output `mine`
    float ws[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) ws[r] = finisher ? w_scale[(size_t)NR * mine + r] : 1.f;

    // The wait sits behind a branch on an argument so ptxas keeps it below the loads above (as gemv_splitk.cu).
    float y_old[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) y_old[b] = 0.f;
    if (k > 0) {
        q3t_grid_dep();
        if (MODE == Q3T_GEMV_ADD && finisher)
#pragma unroll
            for (int b = 0; b < NB; ++b) y_old[b] = y[(size_t)b * n_out + mine];
    }

    // Each vector's sum of squares (the RMS) and largest |x * norm_w| (the digits' scale), block-wide.
    const int k4 = k / 4;
    const float4* xv = reinterpret_cast<const float4*>(x);
    const float4* gv = reinterpret_cast<const float4*>(norm_w);
    const float4 one = make_float4(1.f, 1.f, 1.f, 1.f);
    float ss[NB];
    uint32_t mx[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        ss[b] = 0.f;
        mx[b] = 0u;
    }
    for (int i0 = threadIdx.x; i0 < k4; i0 += 4 * kThreads) {
        float4 a[NB][4], gw[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = i0 + j * kThreads;
            gw[j] = norm_w && i < k4 ? gv[i] : one;
#pragma unroll
            for (int b = 0; b < NB; ++b) a[b][j] = i < k4 ? xv[(size_t)b * k4 + i] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const float4 v = a[b][j];
                ss[b] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
                mx[b] = max(mx[b], abs_bits(norm_w ? mul4(v, gw[j]) : v));
            }
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        ss[b] = warp_sum(ss[b]);
        mx[b] = warp_umax(mx[b]);
        if (lane == 0) {
            red_ss[b][warp] = ss[b];
            red_mx[b][warp] = mx[b];
        }
    }
    __syncthreads();
    int e[NB];
    bool finite[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        uint32_t m = 0u;
        for (int i = 0; i < kWarps; ++i) m = max(m, red_mx[b][i]);
        finite[b] = m < 0x7f800000u;
        int ex = 0;
        if (finite[b]) (void)frexpf(__uint_as_float(m), &ex);  // m < 2^ex
        e[b] = min(6 - ex, 127);  // |x'| < 2^6; 2^e a normal float (a vector below 2^-120 keeps fewer digits)
    }

    // The digit planes: this thread's elements again (L1 holds them), as four digits each.
    for (int i = threadIdx.x; i < k4; i += kThreads) {
        const float4 gw = norm_w ? gv[i] : one;
        const int c = i / 16, p = i % 16;  // chunk, word within a digit's 64 bytes
#pragma unroll
        for (int b = 0; b < NB; ++b) {
            float4 v = xv[(size_t)b * k4 + i];
            if (norm_w) v = mul4(v, gw);
            uint32_t d[4] = {0u, 0u, 0u, 0u};
            if (finite[b]) digits4(v, __int_as_float((e[b] + 127) << 23), d);
            uint32_t* plane = planes + (size_t)b * k + c * 64 + p;
#pragma unroll
            for (int q = 0; q < 4; ++q) plane[16 * q] = d[q];
        }
    }
    __syncthreads();

    // The MMAs: operand A, lane (g, t)'s digit (g % 4 of vector g / 4 % NB) at the chunk's 16 t; two
    // accumulators, so consecutive MMAs do not wait for each other.
    const uint4* dig = reinterpret_cast<const uint4*>(planes) + (size_t)((g / 4) % NB) * (k / 4) + (g % 4) * 4 + t;
    int acc0[4] = {0, 0, 0, 0}, acc1[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < PRE; ++j) {
        const int c = sw + j * splits;  // the same for the whole warp
        if (c < nch) {
            const uint4 a = dig[16 * c];
            mma_s8(acc0, a.x, a.y, pre[j].x, pre[j].y);
            mma_s8(acc1, a.z, a.w, pre[j].z, pre[j].w);
        }
    }
    int c = sw + PRE * splits;
    if constexpr (PRE == kMaxPre)
        for (; c + 3 * splits < nch; c += 4 * splits) {
            uint4 u[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) u[j] = live ? wr[4 * (c + j * splits)] : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const uint4 a = dig[16 * (c + j * splits)];
                mma_s8(acc0, a.x, a.y, u[j].x, u[j].y);
                mma_s8(acc1, a.z, a.w, u[j].z, u[j].w);
            }
        }
    for (; c < nch; c += splits) {
        const uint4 u = live ? wr[4 * c] : make_uint4(0, 0, 0, 0);
        const uint4 a = dig[16 * c];
        mma_s8(acc0, a.x, a.y, u.x, u.y);
        mma_s8(acc1, a.z, a.w, u.z, u.w);
    }
    // Lane (g, t), g < 4 NB: vector g / 4's digit g % 4 of the warp's rows 2 t and 2 t + 1.
    if (g < 4 * NB) {
        part[warp][g][2 * t] = acc0[0] + acc1[0];
        part[warp][g][2 * t + 1] = acc0[1] + acc1[1];
    }
    __syncthreads();

    if (!finisher) return;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        const float scale = norm_w ? rms_scale(red_ss[b], kWarps, k, eps) : 1.f;
        float sum[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            const int lr = NR * (int)threadIdx.x + r;  // the row within the block
            const int* p = &part[(lr / kRows) * splits][4 * b][lr % kRows];
            int dsum[4] = {0, 0, 0, 0};
            for (int s = 0; s < splits; ++s)
#pragma unroll
                for (int q = 0; q < 4; ++q) dsum[q] += p[s * 4 * NB * kRows + q * kRows];
            const double v = (double)dsum[0] + (double)dsum[1] * 0x1p-7 + (double)dsum[2] * 0x1p-14 +
                             (double)dsum[3] * 0x1p-21;
            const float t = finite[b] ? (float)ldexp(v, -e[b]) : __int_as_float(0x7fc00000);
            sum[r] = __fmul_rn(t * scale, ws[r]);  // not contracted into the bias or add
        }
        float* yb = y + (size_t)b * n_out;
        if (MODE == Q3T_GEMV_SWIGLU) {
            const float gt = sum[0], u = sum[NR - 1];
            yb[mine] = (gt / (1.0f + expf(-gt))) * u;  // silu(g) u in float32 as torch does it
        } else if (MODE == Q3T_GEMV_ADD) {
            yb[mine] = y_old[b] + sum[0];
        } else {
            yb[mine] = bias ? sum[0] + bias[mine] : sum[0];
        }
    }
}

using Kernel = void (*)(const int8_t*, const float*, int, int, int, const float*, const float*, float, const float*,
                        float*);

template <int MODE, int NB>
Kernel pick(int chunks_per_lane) {
    if (chunks_per_lane <= 2) return k_gemv_i8mma<MODE, 2, NB>;
    if (chunks_per_lane <= 4) return k_gemv_i8mma<MODE, 4, NB>;
    return k_gemv_i8mma<MODE, kMaxPre, NB>;
}

inline int cdiv(int a, int b) { return (a + b - 1) / b; }

template <int MODE, int NB>
int launch(const void* w, const float* w_scale, int n_rows, int k, const float* x, const float* norm_w, float eps,
           const float* bias, float* y, cudaStream_t s) {
    constexpr int NR = MODE == Q3T_GEMV_SWIGLU ? 2 : 1;
    const int nch = k / kChunk, sms = q3t_host_sms();
    const size_t smem = (size_t)NB * k * 4;  // the digit planes
    // As the split-K kernel's plan: the fewest splits with at most kMaxPre chunks a lane, then of those that
    // leave every warp a chunk, the fewest waves at the kernel's real occupancy, the largest grid among them.
    // The sums do not depend on the choice.
    int splits = 1;
    while (splits < kWarps && cdiv(nch, splits) > kMaxPre) splits *= 2;
    int best = splits, best_waves = 0, best_grid = 0;
    for (int sp = splits; sp <= kWarps && (sp == splits || nch >= sp); sp *= 2) {
        const int grid = cdiv(n_rows, kRows * (kWarps / sp));
        const int slots = q3t_blocks_per_sm(reinterpret_cast<const void*>(pick<MODE, 1>(cdiv(nch, sp))), kThreads, smem) *
                          (sms > 0 ? sms : 1);
        const int waves = cdiv(grid, slots);
        if (best_waves == 0 || waves < best_waves || (waves == best_waves && grid > best_grid)) {
            best = sp;
            best_waves = waves;
            best_grid = grid;
        }
    }
    splits = best;
    const dim3 grid(cdiv(n_rows, kRows * (kWarps / splits)));
    q3t_launch(pick<MODE, NB>(cdiv(nch, splits)), grid, kThreads, smem, s, static_cast<const int8_t*>(w), w_scale,
               n_rows / NR, k, splits, x, norm_w, eps, bias, y);
    return q3t_check_launch(NB == 1 ? "q3t_gemv" : "q3t_gemv_batch");
}

}  // namespace

bool q3t_gemv_i8mma_takes(int dtype, const void* w, int k, const float* x, const float* norm_w) {
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return dtype == Q3T_I8 && q3t_i8_mma() && q3t_host_cc_major() >= 8 && k % kChunk == 0 && k <= 8192 &&
           aligned(w) && aligned(x) && (!norm_w || aligned(norm_w));
}

int q3t_gemv_i8mma(const void* w, const float* w_scale, int n_rows, int k, const float* x, int nb, const float* norm_w,
                   float eps, const float* bias, float* y, int mode, cudaStream_t s) {
#define Q3T_I8MMA_CASE(NB)                                                                                     \
    switch (mode) {                                                                                            \
        case Q3T_GEMV_STORE: return launch<Q3T_GEMV_STORE, NB>(w, w_scale, n_rows, k, x, norm_w, eps, bias, y, s); \
        case Q3T_GEMV_ADD: return launch<Q3T_GEMV_ADD, NB>(w, w_scale, n_rows, k, x, norm_w, eps, bias, y, s);     \
        case Q3T_GEMV_SWIGLU:                                                                                  \
            return launch<Q3T_GEMV_SWIGLU, NB>(w, w_scale, n_rows, k, x, norm_w, eps, bias, y, s);             \
        default: return q3t_fail("q3t_gemv: unknown mode %d", mode);                                          \
    }
    if (nb == 1) { Q3T_I8MMA_CASE(1) }
    if (nb == 2) { Q3T_I8MMA_CASE(2) }
#undef Q3T_I8MMA_CASE
    return q3t_fail("q3t_gemv_batch: nb=%d, expected 1 or 2", nb);
}

#endif  // Q3T_CUDA
