// Shared helpers for the q3t kernels: error reporting, bf16 <-> f32, warp/block reductions.
#pragma once

#include "vendor.h"
#include "../include/q3t.h"

#include <math.h>

// Error reporting (api.cu). Launchers return q3t_fail(...) when arguments are bad and
// q3t_check_launch() after a launch, so the Python side can raise with the runtime's message.
int q3t_fail(const char* fmt, ...);
int q3t_check_launch(const char* what);
// Warp width of the device passed to q3t_init (host side; device code uses Q3T_WARP).
int q3t_host_warp();
// Whether launches use programmatic dependent launch (q3t_set_pdl).
bool q3t_pdl_enabled();
// SM / CU count of the device passed to q3t_init (0 before it).
int q3t_host_sms();
// q3t_set_i8_deep(1): the split-K GEMV plans int8 rows for the most loads per lane (an experiment).
bool q3t_i8_deep();
#if defined(Q3T_CUDA)
// Compute capability major of the device passed to q3t_init (0 before it).
int q3t_host_cc_major();
// Whether the tensor-core batched GEMV splits K across thread-block clusters where it can (sm_90+;
// q3t_set_gemv_clusters(0) turns it off, for A/B runs).
bool q3t_gemv_cluster_enabled();
// q3t_set_gemv_groups(1): the tensor-core batched GEMV takes more than 16 vectors in one launch.
bool q3t_gemv_groups_enabled();
// The tensor-core batched GEMV (gemv_batched_mma.cu): whether it takes this call, the scratch floats
// it needs, and the launch (arguments already checked).
bool q3t_batched_gemv_mma_usable(int dtype, int n_rows);
size_t q3t_batched_gemv_mma_scratch_floats(int dtype, int n_rows, int k);
int q3t_batched_gemv_mma(int dtype, const void* w, const float* w_scale, int n_rows, int k, const float* x, int nb, const float* norm_w, float eps,
                         const float* bias, float* y, int mode, float* scratch, cudaStream_t s);
// q3t_set_i8_mma(0) sends q3t_gemv's and q3t_gemv_batch's int8 calls back to the FMA kernels (A/B runs).
bool q3t_i8_mma();
// The int8 tensor-core GEMV (gemv_i8_mma.cu) of q3t_gemv and q3t_gemv_batch: whether it takes this call
// (Q3T_I8, sm_80+, k a multiple of 64, 16-byte aligned operands, q3t_i8_mma), and the launch (arguments checked).
bool q3t_gemv_i8mma_takes(int dtype, const void* w, int k, const float* x, const float* norm_w);
int q3t_gemv_i8mma(const void* w, const float* w_scale, int n_rows, int k, const float* x, int nb, const float* norm_w,
                   float eps, const float* bias, float* y, int mode, cudaStream_t s);
#endif
// Blocks of a kernel resident on one SM/CU at `threads` threads and `smem` dynamic bytes (cached; gemv_splitk.cu).
int q3t_blocks_per_sm(const void* kernel, int threads, size_t smem);
// The GEMVs' w_scale argument: required with Q3T_I8 weights, NULL with the others (a scale passed for
// bf16 weights is a caller's mistake, not something to ignore). 0, or q3t_fail's -1.
inline int q3t_check_w_scale(const char* what, int dtype, const float* w_scale) {
    if (dtype == Q3T_I8 && !w_scale) return q3t_fail("%s: int8 weights need w_scale", what);
    if (dtype != Q3T_I8 && w_scale) return q3t_fail("%s: w_scale is for int8 weights only (dtype %d)", what, dtype);
    return 0;
}
// The split-K GEMV (gemv_splitk.cu) for nb = 1 or 2 input vectors, arguments already checked.
int q3t_gemv_splitk(int dtype, const void* w, const float* w_scale, int n_rows, int k, const float* x, int nb, const float* norm_w,
                    float eps, const float* bias, float* y, int mode, cudaStream_t s);

// Programmatic dependent launch (CUDA, sm_90+): with it on, the next kernel in the stream (or
// graph) is launched while this one runs, and its blocks wait at griddepcontrol.wait until this
// grid has finished and its writes are visible; so every kernel waits before reading anything a
// predecessor wrote. When the successor may launch is up to each kernel
// (griddepcontrol.launch_dependents); two orders, one rule:
// - q3t_grid_dep (the GEMVs): wait, then let the successor launch.
//   Whatever starts after such a kernel K finds K's predecessor finished.
// - q3t_grid_dep_trigger_first (every other kernel): let the successor launch, then wait, so a
//   GEMV behind an attention kernel or a draw is resident and loading its weights early.
// What reads mutable data before its wait (the attention kernels: K/V rows of earlier positions,
// the Talker position) relies on the first kind: each such value is written by a kernel that
// a GEMV follows (in the frame: every attention kernel, its merge, and q3t_add_i32), and the
// reader comes after that GEMV, so when the reader starts, the writer has finished.
// Without PDL (or on HIP) both are no-ops.
__device__ __forceinline__ void q3t_grid_dep() {
#if defined(Q3T_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void q3t_grid_dep_trigger_first() {
#if defined(Q3T_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Launch `kernel` on stream s, with the PDL attribute when enabled, and (cluster_y > 0, CUDA sm_90+)
// as thread-block clusters of 1 x cluster_y blocks. Errors surface through cudaGetLastError
// (q3t_check_launch) like a <<<>>> launch.
template <typename... KArgs, typename... Args>
inline void q3t_launch_clusters(void (*kernel)(KArgs...), dim3 grid, int cluster_y, dim3 block, size_t smem,
                                cudaStream_t s, Args... args) {
#if defined(Q3T_CUDA)
    if (q3t_pdl_enabled() || cluster_y > 0) {
        cudaLaunchAttribute attr[2];
        int n = 0;
        if (cluster_y > 0) {
            attr[n].id = cudaLaunchAttributeClusterDimension;
            attr[n].val.clusterDim.x = 1;
            attr[n].val.clusterDim.y = cluster_y;
            attr[n].val.clusterDim.z = 1;
            ++n;
        }
        if (q3t_pdl_enabled()) {
            attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[n].val.programmaticStreamSerializationAllowed = 1;
            ++n;
        }
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = s;
        cfg.attrs = attr;
        cfg.numAttrs = n;
        (void)cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
        return;
    }
#else
    (void)cluster_y;  // HIP: no clusters (callers ask only on CUDA)
#endif
    kernel<<<grid, block, smem, s>>>(static_cast<KArgs>(args)...);
}

template <typename... KArgs, typename... Args>
inline void q3t_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args... args) {
    q3t_launch_clusters(kernel, grid, 0, block, smem, s, args...);
}

#define Q3T_STREAM(s) (reinterpret_cast<cudaStream_t>(s))

// bfloat16 is handled as raw 16-bit patterns: the widening is exact, the narrowing rounds to
// nearest even, and no vendor bf16 type (which differ between CUDA and HIP versions) is needed.
__device__ __forceinline__ float bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

// One 16-byte load of weights W (float: 4, bf16: 8, int8: 16) dotted with 4, 8 or 16 floats of x;
// shared by the GEMV kernels.
template <typename W> struct WeightVec16;
template <> struct WeightVec16<float> {
    static constexpr int N = 4;  // weights per 16-byte load
    __device__ static __forceinline__ float dot(const uint4& u, const float* x) {
        const float4 a = *reinterpret_cast<const float4*>(x);
        float s = __uint_as_float(u.x) * a.x;
        s += __uint_as_float(u.y) * a.y;
        s += __uint_as_float(u.z) * a.z;
        s += __uint_as_float(u.w) * a.w;
        return s;
    }
};
template <> struct WeightVec16<uint16_t> {
    static constexpr int N = 8;
    __device__ static __forceinline__ float dot(const uint4& u, const float* x) {
        const float4 a = *reinterpret_cast<const float4*>(x);
        const float4 b = *reinterpret_cast<const float4*>(x + 4);
        float s = bf16_lo(u.x) * a.x;
        s += bf16_hi(u.x) * a.y;
        s += bf16_lo(u.y) * a.z;
        s += bf16_hi(u.y) * a.w;
        s += bf16_lo(u.z) * b.x;
        s += bf16_hi(u.z) * b.y;
        s += bf16_lo(u.w) * b.z;
        s += bf16_hi(u.w) * b.w;
        return s;
    }
};
// int8 weights (Q3T_I8), four to a 32-bit word, as exact float32. Without the int-to-float instruction,
// which NVIDIA runs at a quarter of the FMA rate (an int8 GEMV converts one weight per FMA, and at
// the memory's pace that is ~36 weights per clock per SM on an H200): the byte, biased to unsigned
// (q ^ 0x80 = q + 128), becomes the low mantissa bits of 2^23, i.e. the float 2^23 + q + 128 exactly,
// and one subtraction of 2^23 + 128 (exact: the result is an integer of |q| <= 128) leaves q. AMD
// converts an unsigned byte to float in one full-rate instruction (v_cvt_f32_ubyte0..3).
__device__ __forceinline__ void i8x4_to_f32(uint32_t u, float (&f)[4]) {
    const uint32_t b = u ^ 0x80808080u;
#if defined(Q3T_CUDA)
    f[0] = __uint_as_float(__byte_perm(b, 0x4b000000u, 0x7650)) - 8388736.f;
    f[1] = __uint_as_float(__byte_perm(b, 0x4b000000u, 0x7651)) - 8388736.f;
    f[2] = __uint_as_float(__byte_perm(b, 0x4b000000u, 0x7652)) - 8388736.f;
    f[3] = __uint_as_float(__byte_perm(b, 0x4b000000u, 0x7653)) - 8388736.f;
#else
    f[0] = (float)(b & 0xffu) - 128.f;
    f[1] = (float)((b >> 8) & 0xffu) - 128.f;
    f[2] = (float)((b >> 16) & 0xffu) - 128.f;
    f[3] = (float)(b >> 24) - 128.f;
#endif
}
template <> struct WeightVec16<int8_t> {
    static constexpr int N = 16;
    __device__ static __forceinline__ float dot(const uint4& u, const float* x) {
        const uint32_t words[4] = {u.x, u.y, u.z, u.w};
        float s = 0.f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const float4 a = *reinterpret_cast<const float4*>(x + 4 * q);
            float f[4];
            i8x4_to_f32(words[q], f);
            if (q == 0) {
                s = f[0] * a.x;  // the first product as bf16's and float32's dot start theirs
            } else {
                s += f[0] * a.x;
            }
            s += f[1] * a.y;
            s += f[2] * a.z;
            s += f[3] * a.w;
        }
        return s;
    }
};

// Where the one-vector GEMVs keep their staged input x in shared memory. A lane's 16-byte weight load
// covers N consecutive k (WeightVec16), and consecutive lanes take consecutive loads, so they read x at
// a stride of N floats: 64 bytes for int8, 32 for bf16. Shared memory serves 16-byte reads 8 lanes at
// a time from 32 banks of 4 bytes; at a 64-byte stride those 8 lanes meet only 2 distinct groups of 4
// banks (a 4-way conflict: a warp's 16-byte read of x takes 16 passes where 4 would do), at 32 bytes 4
// (2-way). For int8 that is 4 passes for every 16 bytes of weights, one pass a clock per SM: a cap of
// ~8 weight bytes a clock per SM, ~2.1 TB/s on an H200, about the rate int8 measured (docs/int8.md).
// So x is stored padded for bf16 and int8: one float4 of padding after every 8 float4s, element e at
// e + 4 * (e / 32). A lane's x then starts at float4 4c + c / 2 (int8; bf16: 2c + c / 4), 8 distinct
// bank groups for 8 lanes, and each load's x stays contiguous (a 64-byte chunk never straddles a
// group), read at the same immediate offsets as before. Only where x sits changes, not the sums.
template <typename W> __host__ __device__ constexpr bool xs_padded() { return WeightVec16<W>::N > 4; }
__host__ __device__ constexpr int xs_at(int e, bool pad) { return pad ? e + ((e >> 5) << 2) : e; }
// xs_at(c * N) for the x of a 16-byte load c (N weights of W a load): c * N + 4 * (c / (32 / N)).
template <typename W, bool PAD> __device__ __forceinline__ int xs_chunk(int c) {
    constexpr int N = WeightVec16<W>::N;
    return PAD ? c * N + (int)(((unsigned)c / (32 / N)) << 2) : c * N;  // c >= 0: a shift
}
// Floats of shared memory a vector of k takes (padded: the last group's padding too; a multiple of 4).
__host__ __device__ constexpr int xs_len(int k, bool pad) { return pad ? k + (((k + 31) >> 5) << 2) : k; }

// Whether weights of type W are int8 with a float32 scale per row (Q3T_I8), applied once to each row's
// float32 sum: y = (sum_k q[k] xn[k]) * scale. A run-time `if` on it, not `if constexpr`: the
// kernels of the other dtypes then still name their w_scale argument (hipcc -Werror=unused-parameter)
// and the compiler drops the branch all the same.
template <typename W> __host__ __device__ constexpr bool row_scaled() { return sizeof(W) == 1; }

__device__ __forceinline__ float bf16_to_f32(uint16_t u) { return __uint_as_float(((uint32_t)u) << 16); }
__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
// Two floats as bf16 in one word, the first in the low half (the order of memory), each as f32_to_bf16.
__device__ __forceinline__ uint32_t f32x2_to_bf16x2(float lo, float hi) {
    return (uint32_t)f32_to_bf16(lo) | ((uint32_t)f32_to_bf16(hi) << 16);
}

template <typename T> struct Elem;
template <> struct Elem<float> {
    __device__ static __forceinline__ float load(const float* p, int i) { return p[i]; }
    __device__ static __forceinline__ void store(float* p, int i, float v) { p[i] = v; }
};
template <> struct Elem<int8_t> {  // weights only: read, never written
    __device__ static __forceinline__ float load(const int8_t* p, int i) { return (float)p[i]; }
};
template <> struct Elem<uint16_t> {
    __device__ static __forceinline__ float load(const uint16_t* p, int i) { return bf16_to_f32(p[i]); }
    __device__ static __forceinline__ void store(uint16_t* p, int i, float v) { p[i] = f32_to_bf16(v); }
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int m = Q3T_WARP / 2; m > 0; m >>= 1) v += Q3T_SHFL_XOR(v, m);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int m = Q3T_WARP / 2; m > 0; m >>= 1) v = fmaxf(v, Q3T_SHFL_XOR(v, m));
    return v;
}

// Block-wide sum; every thread gets the result. red needs blockDim.x / Q3T_WARP floats
// (at most 32). Works for any block size that is a multiple of the warp, or below one warp.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x % Q3T_WARP, warp = threadIdx.x / Q3T_WARP;
    const int nwarps = (blockDim.x + Q3T_WARP - 1) / Q3T_WARP;
    v = warp_sum(v);
    __syncthreads();  // red may still be read by a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < nwarps; ++i) t += red[i];
    return t;
}

__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x % Q3T_WARP, warp = threadIdx.x / Q3T_WARP;
    const int nwarps = (blockDim.x + Q3T_WARP - 1) / Q3T_WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int i = 0; i < nwarps; ++i) t = fmaxf(t, red[i]);
    return t;
}

// The RMSNorm scale rsqrt(mean(x^2) + eps) of a vector of k from n partial sums of squares, added in order.
__device__ __forceinline__ float rms_scale(const float* partials, int n, int k, float eps) {
    float total = 0.f;
    for (int i = 0; i < n; ++i) total += partials[i];
    return rsqrtf(total / (float)k + eps);
}

// Loads of activations other blocks or kernels wrote (K/V rows, q/k/v, logits, and the split
// attention's partials, which the last block of a head merges): read at L2, the point of coherence,
// past a possibly stale L1; the writers' __threadfence orders the partials before their count. On
// HIP, __threadfence (agent-scope acquire/release) invalidates the vector L1, so a plain load is
// enough.
template <typename T>
__device__ __forceinline__ T q3t_ld_act(const T* p) {
#if defined(Q3T_CUDA)
    return __ldcg(p);  // float, int and unsigned short (bf16 bits) overloads
#else
    return *p;
#endif
}

// The GEMVs' input vector into shared memory: xs[i] = x[i] * g[i] (g may be NULL: x[i]), block-wide;
// returns this thread's share of sum(x^2). With K a multiple of 4 and x, g 16-byte aligned it reads
// float4s, four per thread in flight at once, so K <= 4096 costs one round trip to L2 (a strided
// scalar loop costs one per 1,024 elements; the frame has ~430 GEMVs waiting on this).
// pad: xs padded for the dot products (xs_at).
__device__ __forceinline__ float stage_x(const float* __restrict__ x, const float* __restrict__ g, int k,
                                         float* __restrict__ xs, bool pad = false) {
    float ss = 0.f;
    const bool vec = k % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(g) % 16 == 0;
    if (vec) {
        const float4* xv = reinterpret_cast<const float4*>(x);
        const float4* gv = reinterpret_cast<const float4*>(g);
        float4* xsv = reinterpret_cast<float4*>(xs);
        const int k4 = k / 4;
        // Padded, float4 i sits at i + i / 8; i0 + j * blockDim.x (a multiple of 8) at p0 + j * pstride.
        const int pstride = pad ? blockDim.x + (blockDim.x >> 3) : blockDim.x;
        for (int i0 = threadIdx.x; i0 < k4; i0 += 4 * blockDim.x) {
            const int p0 = pad ? i0 + (i0 >> 3) : i0;
            float4 a[4], w[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int i = i0 + j * blockDim.x;
                a[j] = i < k4 ? xv[i] : make_float4(0.f, 0.f, 0.f, 0.f);
                w[j] = (g && i < k4) ? gv[i] : make_float4(1.f, 1.f, 1.f, 1.f);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int i = i0 + j * blockDim.x;
#if defined(Q3T_CUDA)
                if (i >= k4) break;
#else
                // clang unrolls no loop that breaks, and a[], w[] indexed at run time live in scratch
                // memory; the later j only have larger i.
                if (i >= k4) continue;
#endif
                ss += a[j].x * a[j].x + a[j].y * a[j].y + a[j].z * a[j].z + a[j].w * a[j].w;
                xsv[p0 + j * pstride] =
                    g ? make_float4(a[j].x * w[j].x, a[j].y * w[j].y, a[j].z * w[j].z, a[j].w * w[j].w) : a[j];
            }
        }
        return ss;
    }
#pragma unroll 4
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        const float v = x[i];
        xs[xs_at(i, pad)] = g ? v * g[i] : v;
        ss += v * v;
    }
    return ss;
}

// Row `tok` of an embedding table [rows, h] (`T`) as float32 into out, elements first, first + stride,
// ...; tok is clamped into the table (a bad id must not read out of bounds). q3t_embed_row and the
// draw that writes the next CodePredictor input both copy rows this way.
template <typename T>
__device__ __forceinline__ void copy_embedding_row(const T* __restrict__ table, int rows, int h, int tok,
                                                   float* __restrict__ out, int first, int stride) {
    tok = tok < 0 ? 0 : (tok >= rows ? rows - 1 : tok);
    const T* row = table + (size_t)tok * h;
    for (int i = first; i < h; i += stride) out[i] = Elem<T>::load(row, i);
}

__device__ __forceinline__ int read_pos(const int* pos_ptr, int pos_add) {
    return (pos_ptr ? *pos_ptr : 0) + pos_add;
}
