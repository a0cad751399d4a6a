// q3t_cp_passes: CodePredictor positions first..last of one stream's frame (each: its layers, the
// final norm + lm_head, the draw, the next position's input row) in one persistent launch, CUDA sm_90+.
//
// Why: the layered passes cost 103-115 us each on the H200 against a 35 us byte floor. The time is
// the chain of 27 dependent launches a pass, ~4 us each for 2-13 MB: every launch waits for its
// predecessor, then pays an L2 round trip for its input, its arithmetic, the reduction and the
// write before the next one may start. The first persistent kernel (removed, ABI 2) kept that chain
// inside one launch and lost 7 %: its grid-wide barriers cost ~5.7 us a phase, and each phase still
// loaded its weights after the barrier. Here:
// - One block per SM, and the weights of the phases ahead stream into shared memory (a ring of
//   ~210 KB a block) by TMA bulk copies (cp.async.bulk, completion on an mbarrier) while the block
//   works on the current phase and waits at the barrier, so no phase waits for DRAM after its barrier
//   unless the ring is full. Each block owns a contiguous run of rows of every matrix: one copy each.
// - A barrier is one release-add per block on a counter and an acquire poll by one thread
//   (no cooperative-groups grid sync): ~1-2 us where a launch under PDL costs ~4.
// - The draw runs in every block on the same logits with the same random bits, so every block knows
//   the code without a barrier, reads the next position's input row itself and goes straight on to
//   the next pass's first GEMV; block 0 writes the code and the residual stream.
// - Phases per pass: per layer qkv, attention (the first hq blocks, one head each: the block code of
//   q3t_rope_attention, so the cache rows and outputs are its bits), o (+ residual), gate/up
//   (SwiGLU), down (+ residual); then the head. Five barriers a layer and one for the head.
// Activations other blocks wrote are read at L2 (__ldcg): L1 is not coherent within a launch.
// The launch never lets its successor start early (no griddepcontrol.launch_dependents): a
// successor's blocks resident on an SM could keep one of this grid's blocks from ever starting
// while the others wait for it at a barrier.
// HIP has no TMA and no PDL, so the entry point fails there and the backend keeps the layered passes.
#include "attention_short.cuh"
#include "sample_block.cuh"

#if defined(Q3T_CUDA)
#include <algorithm>
#include <mutex>
#include <stdio.h>

namespace {

constexpr int kCpThreads = 512;
constexpr int kCpMaxLayers = 8;
constexpr int kCpPositions = 16;  // codes in a frame: positions 0..15

struct CpLayer {
    const float* in_norm;
    const void* qkv;
    const float* q_norm;
    const float* k_norm;
    const void* o;
    const float* post_norm;
    const void* gate_up;  // interleaved gate/up rows
    const void* down;
    void* k_cache;  // [max_seq, hkv, d]
    void* v_cache;
};

struct CpArgs {
    CpLayer layer[kCpMaxLayers];
    const void* head[kCpPositions];   // lm_head of position j at [j] (j >= 1)
    const void* input[kCpPositions];  // the input table of position j at [j]: row = code j - 1
    const float* final_norm;
    const float* cos_tab;
    const float* sin_tab;
    float* x;       // [hidden] residual stream (position first's input row on entry)
    float* qkv;     // [(hq + 2 hkv) d]
    float* attn;    // [hq d]
    float* mlp;     // [inter]
    float* logits;  // [vocab]
    int* codes;     // [16]: code j written at [j]
    const int* slot;                   // NULL: 0; else the stream's slot, indexing the three below
    const q3t_sample_params* params;   // NULL: flags, temperature, top_k, top_p below
    const unsigned long long* seed_ptr;
    const int* step_ptr;
    unsigned* sync;  // [2]: barrier arrivals, blocks out (zero between launches)
    long long* trace;  // NULL, or block 0's clock64 at each step of each phase (q3t.h)
    int n_layers, hidden, inter, hq, hkv, d, max_seq, vocab, first, last, input_dtype;
    float eps, scale;
    int flags, top_k;
    float temperature, top_p;
    int region_bytes, ring_bytes;  // dynamic shared memory: the region, then the ring
};

// The device code needs sm_90 (TMA, mbarrier transaction counts, griddepcontrol); images built for
// older GPUs as well (docker/Dockerfile.cuda: sm_80...) get a kernel that traps, which the launcher
// never starts there (q3t_host_cc_major() < 9).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define Q3T_CP_DEVICE 1
#else
#define Q3T_CP_DEVICE 0
#endif

#if Q3T_CP_DEVICE
constexpr int kCpDepth = 8;  // weight chunks in flight per block at most (one mbarrier each)

enum : int { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3, kHead = 4 };

// One weight phase (index wi over the launch: per position 4 per layer, then the head): the
// matrix, its output units (a unit is one row, or a gate/up pair) and K.
struct CpMatrix {
    const unsigned char* w;
    int unit_rows, units, k, kind;
};
__device__ __forceinline__ CpMatrix cp_matrix(const CpArgs& a, int wi) {
    const int per_pos = 4 * a.n_layers + 1;
    const int p = wi / per_pos, r = wi - p * per_pos;
    if (r == 4 * a.n_layers)
        return {static_cast<const unsigned char*>(a.head[a.first + p]), 1, a.vocab, a.hidden, kHead};
    const CpLayer& L = a.layer[r / 4];
    switch (r % 4) {
        case kQkv: return {static_cast<const unsigned char*>(L.qkv), 1, (a.hq + 2 * a.hkv) * a.d, a.hidden, kQkv};
        case kO: return {static_cast<const unsigned char*>(L.o), 1, a.hidden, a.hq * a.d, kO};
        case kGateUp: return {static_cast<const unsigned char*>(L.gate_up), 2, a.inter, a.hidden, kGateUp};
        default: return {static_cast<const unsigned char*>(L.down), 1, a.hidden, a.inter, kDown};
    }
}
// This block's units [u0, u1) of a matrix with `units` units: contiguous and balanced.
__device__ __forceinline__ int cp_unit(int units, int b) { return (int)((long long)units * b / gridDim.x); }

// --- TMA bulk copies and mbarriers ----------------------------------------------------------------
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* m) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(m)) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* m, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(m)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* m, unsigned parity) {
    unsigned done = 0;
    do {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(smem_addr(m)), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, uint64_t* m) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(m))
                 : "memory");
}
// Shared memory the threads read (generic proxy) before the bulk copies (async proxy) overwrite it.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// --- the grid barrier ---------------------------------------------------------------------------------
__device__ __forceinline__ void arrive(unsigned* count) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
}
__device__ __forceinline__ void await(const unsigned* count, unsigned target) {
    unsigned v;
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
    } while (v < target);
}

// The ring of weight chunks (thread 0's bookkeeping; each block its own). Chunks are placed in order,
// each contiguous (one that does not fit before the end starts at 0) and freed in order.
struct Ring {
    int issued, consumed, tail;
};
template <typename T>
__device__ void ring_issue(const CpArgs& a, int n_w, Ring& r, unsigned char* ring, uint64_t* mbar, int* off) {
    bool fenced = false;
    while (r.issued < n_w && r.issued - r.consumed < kCpDepth) {
        const CpMatrix m = cp_matrix(a, r.issued);
        const int u0 = cp_unit(m.units, blockIdx.x), u1 = cp_unit(m.units, blockIdx.x + 1);
        const int row_bytes = m.k * (int)sizeof(T);
        const int bytes = (u1 - u0) * m.unit_rows * row_bytes;
        int p;
        if (r.issued == r.consumed) {
            p = 0;
        } else {
            const int head = off[r.consumed % kCpDepth];
            if (r.tail > head)
                p = r.tail + bytes <= a.ring_bytes ? r.tail : (bytes <= head ? 0 : -1);
            else
                p = r.tail + bytes <= head ? r.tail : -1;
        }
        if (p < 0) break;
        if (!fenced) {
            fence_proxy_async();
            fenced = true;
        }
        const int slot = r.issued % kCpDepth;
        off[slot] = p;
        mbar_expect(&mbar[slot], (unsigned)bytes);
        if (bytes > 0) bulk_load(ring + p, m.w + (size_t)u0 * m.unit_rows * row_bytes, (unsigned)bytes, &mbar[slot]);
        r.tail = p + bytes;
        ++r.issued;
    }
}

// xs[i] = src[i] * g[i] (g may be NULL) for i < k, block-wide; returns the RMS scale
// rsqrt(mean(src^2) + eps) (1 without g). `l2`: src was written by other blocks (read at L2). With
// `mirror`, also writes src into it (block 0: the residual stream from the drawn code's row).
template <typename S>
__device__ float cp_stage(const S* src, bool l2, const float* g, int k, float eps, float* xs, float* mirror,
                          float* red) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        float v;  // scalar loads: k / 512 of them a thread, one round trip
        if constexpr (sizeof(S) == 4)
            v = l2 ? __ldcg(reinterpret_cast<const float*>(src) + i) : reinterpret_cast<const float*>(src)[i];
        else
            v = bf16_to_f32(src[i]);
        if (mirror) mirror[i] = v;
        xs[i] = g ? v * g[i] : v;
        ss += v * v;
    }
    if (!g) {
        __syncthreads();  // publishes xs
        return 1.f;
    }
    const float total = block_sum(ss, red);  // its barriers also publish xs
    return rsqrtf(total / (float)k + eps);
}

// This block's units of weight phase wi (its chunk at `w` in the ring): y[u] = rs * dot(row u, xs),
// stored, added to y (residual) or, for gate/up pairs, silu(gate) * up.
template <typename T>
__device__ void cp_gemv(const CpMatrix& m, const T* w, const float* xs, float rs, float* y) {
    constexpr int V = WeightVec16<T>::N;
    const int lane = threadIdx.x % Q3T_WARP, warp = threadIdx.x / Q3T_WARP, nwarps = blockDim.x / Q3T_WARP;
    const int u0 = cp_unit(m.units, blockIdx.x), u1 = cp_unit(m.units, blockIdx.x + 1);
    const int nvec = m.k / V;
    for (int u = u0 + warp; u < u1; u += nwarps) {
        const T* row = w + (size_t)(u - u0) * m.unit_rows * m.k;
        float acc0 = 0.f, acc1 = 0.f;
        for (int c = lane; c < nvec; c += Q3T_WARP) {
            acc0 += WeightVec16<T>::dot(reinterpret_cast<const uint4*>(row)[c], xs + c * V);
            if (m.unit_rows == 2) acc1 += WeightVec16<T>::dot(reinterpret_cast<const uint4*>(row + m.k)[c], xs + c * V);
        }
        acc0 = warp_sum(acc0);
        if (m.unit_rows == 2) acc1 = warp_sum(acc1);
        if (lane == 0) {
            const float s0 = acc0 * rs;
            if (m.kind == kGateUp) {
                const float u1v = acc1 * rs;
                y[u] = (s0 / (1.0f + expf(-s0))) * u1v;  // silu(g) * up, as the layered GEMV
            } else if (m.kind == kO || m.kind == kDown) {
                y[u] = __ldcg(y + u) + s0;
            } else {
                y[u] = s0;
            }
        }
    }
}

#endif  // Q3T_CP_DEVICE

template <typename T>
__global__ void __launch_bounds__(kCpThreads, 1) k_cp_passes(const __grid_constant__ CpArgs a) {
#if !Q3T_CP_DEVICE
    __trap();
#else
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) uint64_t mbar[kCpDepth];
    __shared__ int ring_off[kCpDepth];
    __shared__ float red[32];
    __shared__ int other_code;  // where blocks other than 0 let the draw write its code
    float* region = reinterpret_cast<float*>(smem);
    unsigned char* ring = smem + a.region_bytes;
    const int tid = threadIdx.x;
    const bool lead = blockIdx.x == 0;
    const int per_pos = 4 * a.n_layers + 1;
    const int n_w = (a.last - a.first + 1) * per_pos;
    Ring r{0, 0, 0};
    if (tid == 0) {
        for (int s = 0; s < kCpDepth; ++s) mbar_init(&mbar[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        ring_issue<T>(a, n_w, r, ring, mbar, ring_off);  // weights never change: before the wait
    }
    // Everything else (x, the caches, the slot, the frame counter) was written by earlier kernels.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const int slot = a.slot ? *a.slot : 0;
    if (slot < 0) {  // a padding row (graphs captured over an idle decoder): nothing to do, but the copies land first
        if (tid == 0)
            for (int wi = 0; wi < r.issued; ++wi) mbar_wait(&mbar[wi % kCpDepth], (unsigned)(wi / kCpDepth) & 1u);
        return;
    }
    const int step = a.step_ptr ? a.step_ptr[slot] : 0;
    const unsigned long long* seed = a.seed_ptr ? a.seed_ptr + slot : nullptr;
    int flags = a.flags, top_k = a.top_k;
    float temperature = a.temperature, top_p = a.top_p;
    if (a.params) {
        const q3t_sample_params p = a.params[slot];
        flags = p.flags;
        top_k = p.top_k;
        temperature = p.temperature;
        top_p = p.top_p;
    }
    __syncthreads();

    unsigned barriers = 0;
    int marks = 0;
    auto mark = [&]() {  // the trace: block 0's clock when its thread 0 gets here
        if (a.trace && lead && tid == 0) a.trace[marks] = clock64();
        ++marks;
    };
    auto phase_end = [&](bool consumed_chunk) {
        __syncthreads();  // this block's writes done, its chunk read
        mark();
        if (tid == 0) {
            arrive(a.sync);
            if (consumed_chunk) {
                ++r.consumed;
                ring_issue<T>(a, n_w, r, ring, mbar, ring_off);
            }
            await(a.sync, (barriers + 1) * gridDim.x);
        }
        ++barriers;
        __syncthreads();
        mark();
    };
    auto chunk = [&](int wi) {
        mbar_wait(&mbar[wi % kCpDepth], (unsigned)(wi / kCpDepth) & 1u);
        mark();
        return reinterpret_cast<const T*>(ring + ring_off[wi % kCpDepth]);
    };

    int wi = 0, code = -1;
    for (int j = a.first; j <= a.last; ++j) {
        for (int l = 0; l < a.n_layers; ++l, wi += 4) {
            const CpLayer& L = a.layer[l];
            float rs;
            mark();
            if (l == 0 && j > a.first) {  // the drawn code's row: every block reads it, block 0 keeps it in x
                if (a.input_dtype == Q3T_F32)
                    rs = cp_stage(static_cast<const float*>(a.input[j]) + (size_t)code * a.hidden, false, L.in_norm,
                                  a.hidden, a.eps, region, lead ? a.x : nullptr, red);
                else
                    rs = cp_stage(static_cast<const uint16_t*>(a.input[j]) + (size_t)code * a.hidden, false, L.in_norm,
                                  a.hidden, a.eps, region, lead ? a.x : nullptr, red);
            } else {
                rs = cp_stage(a.x, true, L.in_norm, a.hidden, a.eps, region, nullptr, red);
            }
            mark();
            cp_gemv<T>(cp_matrix(a, wi), chunk(wi), region, rs, a.qkv);
            phase_end(true);

            // Attention: one q head per block, q3t_rope_attention's block code.
            mark();
            {
                T* kc = static_cast<T*>(L.k_cache);
                T* vc = static_cast<T*>(L.v_cache);
                const int group = a.hq / a.hkv;
                for (int h = blockIdx.x; h < a.hq; h += gridDim.x) {
                    T* hist = reinterpret_cast<T*>(region + 3 * a.d + kShortMaxSeq);
                    short_history<T>(kc, vc, j, h / group, a.hkv, a.d, hist);
                    const ShortConsts c = short_head_consts(L.q_norm, L.k_norm, a.cos_tab, a.sin_tab, j, a.d);
                    short_head<T>(a.qkv, c, a.eps, j, h, a.hq, a.hkv, a.d, a.scale, kc, vc, hist, a.attn, region, red);
                    __syncthreads();  // region is this head's until its outputs are written
                }
            }
            phase_end(false);

            mark();
            rs = cp_stage(a.attn, true, nullptr, a.hq * a.d, 0.f, region, nullptr, red);
            mark();
            cp_gemv<T>(cp_matrix(a, wi + 1), chunk(wi + 1), region, rs, a.x);
            phase_end(true);

            mark();
            rs = cp_stage(a.x, true, L.post_norm, a.hidden, a.eps, region, nullptr, red);
            mark();
            cp_gemv<T>(cp_matrix(a, wi + 2), chunk(wi + 2), region, rs, a.mlp);
            phase_end(true);

            mark();
            rs = cp_stage(a.mlp, true, nullptr, a.inter, 0.f, region, nullptr, red);
            mark();
            cp_gemv<T>(cp_matrix(a, wi + 3), chunk(wi + 3), region, rs, a.x);
            phase_end(true);
        }
        mark();
        const float rs = cp_stage(a.x, true, a.final_norm, a.hidden, a.eps, region, nullptr, red);
        mark();
        cp_gemv<T>(cp_matrix(a, wi), chunk(wi), region, rs, a.logits);
        phase_end(true);
        ++wi;

        // The draw, in every block alike (q3t_sample's device code; the logits are read at L2).
        const uint32_t bits = draw_bits(seed, j, step);
        float* L = region;
        int* cand = reinterpret_cast<int*>(region + a.vocab);
        code = sample_block<kCpThreads>(a.logits, a.vocab, nullptr, 1.0f, -1, 0, 0, 0, flags, temperature, top_k, top_p,
                                        step, bits, lead ? a.codes + j : &other_code, L, cand);
        __syncthreads();  // L is the next staging's region
        mark();
    }
    // The last block out resets the counters for the next launch (every block is past its last poll).
    if (tid == 0) {
        __threadfence();
        if (atomicAdd(a.sync + 1, 1u) == gridDim.x - 1) {
            a.sync[0] = 0;
            a.sync[1] = 0;
        }
    }
#endif
}

// The dynamic shared memory of k_cp_passes<T> (all an SM's, less its static), set up and checked once per T
// (the first launch is an eager one, outside any graph capture).
struct CpPlan {
    int dyn = 0, err = 0;
    char msg[200] = "";
};
template <typename T>
const CpPlan& cp_plan() {
    static CpPlan plan;
    static std::once_flag once;
    std::call_once(once, [] {
        int dev = 0, optin = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        cudaFuncAttributes attr;
        if (cudaFuncGetAttributes(&attr, (const void*)k_cp_passes<T>) != cudaSuccess) {
            plan.err = 1;
            snprintf(plan.msg, sizeof plan.msg, "cudaFuncGetAttributes failed");
            return;
        }
        plan.dyn = (optin - (int)attr.sharedSizeBytes) / 128 * 128;
        int per_sm = 0;
        if (cudaFuncSetAttribute((const void*)k_cp_passes<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.dyn) !=
                cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_cp_passes<T>, kCpThreads, plan.dyn) != cudaSuccess ||
            per_sm < 1) {
            plan.err = 1;
            snprintf(plan.msg, sizeof plan.msg, "a block of %d threads with %d bytes of shared memory does not fit an SM",
                     kCpThreads, plan.dyn);
        }
        (void)cudaGetLastError();
    });
    return plan;
}

template <typename T>
int launch_cp(CpArgs& a, int region_floats, cudaStream_t s) {
    const CpPlan& plan = cp_plan<T>();
    if (plan.err) return q3t_fail("q3t_cp_passes: %s", plan.msg);
    a.region_bytes = (region_floats * 4 + 127) / 128 * 128;
    a.ring_bytes = plan.dyn - a.region_bytes;
    // The largest chunk any block loads: every weight phase's units split over the grid, rounded up.
    const int g = q3t_host_sms();
    const int units[5] = {(a.hq + 2 * a.hkv) * a.d, a.hidden, a.inter, a.hidden, a.vocab};  // qkv o gate/up down head
    const int rows[5] = {1, 1, 2, 1, 1};
    const int ks[5] = {a.hidden, a.hq * a.d, a.hidden, a.inter, a.hidden};
    long long largest = 0;
    for (int i = 0; i < 5; ++i)
        largest = std::max(largest, (long long)(units[i] + g - 1) / g * rows[i] * ks[i] * (long long)sizeof(T));
    if (largest > a.ring_bytes)
        return q3t_fail("q3t_cp_passes: a block's chunk of %lld bytes does not fit its %d-byte ring", largest,
                        a.ring_bytes);
    q3t_launch(k_cp_passes<T>, g, kCpThreads, plan.dyn, s, a);
    return q3t_check_launch("q3t_cp_passes");
}

}  // namespace
#endif

extern "C" Q3T_API int q3t_cp_passes(int dtype, const void* const* layer_ptrs, int n_layers, const void* const* heads,
                                     const void* const* inputs, int input_dtype, int first, int last, int hidden,
                                     int inter, int hq, int hkv, int d, int max_seq, int vocab, float eps, float scale,
                                     const float* final_norm, const float* cos_tab, const float* sin_tab, float* x,
                                     float* qkv, float* attn, float* mlp, float* logits, int* codes, int flags,
                                     float temperature, int top_k, float top_p, const int* slot,
                                     const q3t_sample_params* params, const unsigned long long* seed_ptr,
                                     const int* step_ptr, unsigned* sync, long long* trace, void* stream) {
#if defined(Q3T_CUDA)
    if (q3t_host_cc_major() < 9) return q3t_fail("q3t_cp_passes: needs CUDA sm_90 or newer (TMA bulk copies)");
    // bf16 only: the decode loop's dtype (a float32 build of the kernel spilled at one block of 512 per SM).
    if (dtype != Q3T_BF16) return q3t_fail("q3t_cp_passes: bf16 weights and caches only (dtype %d)", dtype);
    if (input_dtype != Q3T_BF16 && input_dtype != Q3T_F32) return q3t_fail("q3t_cp_passes: bad input_dtype %d", input_dtype);
    if (!layer_ptrs || !heads || !inputs || n_layers < 1 || n_layers > kCpMaxLayers)
        return q3t_fail("q3t_cp_passes: bad layers (%d, at most %d)", n_layers, kCpMaxLayers);
    if (first < 1 || last < first || last >= kCpPositions || last >= max_seq)
        return q3t_fail("q3t_cp_passes: positions %d..%d out of 1..%d", first, last, kCpPositions - 1);
    if (!short_shape_ok(hq, hkv, d, max_seq)) return q3t_fail("q3t_cp_passes: bad attention shape");
    const int es = 2;
    if ((hidden * es) % 16 || (inter * es) % 16 || (hq * d * es) % 16 || vocab < 1 || vocab > kSampleMaxV)
        return q3t_fail("q3t_cp_passes: rows must be whole 16-byte units and vocab <= %d", kSampleMaxV);
    if (!final_norm || !cos_tab || !sin_tab || !x || !qkv || !attn || !mlp || !logits || !codes || !sync)
        return q3t_fail("q3t_cp_passes: null buffer");
    CpArgs a = {};
    for (int l = 0; l < n_layers; ++l) {
        const void* const* p = layer_ptrs + 10 * l;
        a.layer[l] = CpLayer{static_cast<const float*>(p[0]), p[1], static_cast<const float*>(p[2]),
                             static_cast<const float*>(p[3]), p[4], static_cast<const float*>(p[5]), p[6], p[7],
                             const_cast<void*>(p[8]), const_cast<void*>(p[9])};
    }
    for (int j = first; j <= last; ++j) {
        a.head[j] = heads[j - 1];
        a.input[j] = inputs[j - 1];
        if (!a.head[j] || !a.input[j]) return q3t_fail("q3t_cp_passes: no head or input table for position %d", j);
    }
    a.final_norm = final_norm;
    a.cos_tab = cos_tab;
    a.sin_tab = sin_tab;
    a.x = x;
    a.qkv = qkv;
    a.attn = attn;
    a.mlp = mlp;
    a.logits = logits;
    a.codes = codes;
    a.slot = slot;
    a.params = params;
    a.seed_ptr = seed_ptr;
    a.step_ptr = step_ptr;
    a.sync = sync;
    a.trace = trace;
    a.n_layers = n_layers;
    a.hidden = hidden;
    a.inter = inter;
    a.hq = hq;
    a.hkv = hkv;
    a.d = d;
    a.max_seq = max_seq;
    a.vocab = vocab;
    a.first = first;
    a.last = last;
    a.input_dtype = input_dtype;
    a.eps = eps;
    a.scale = scale;
    a.flags = flags;
    a.top_k = top_k;
    a.temperature = temperature;
    a.top_p = top_p;
    // The region: staged inputs (K floats), the draw's scratch (vocab floats and ints) and a head's
    // attention (3 d + kShortMaxSeq floats, then the K/V history).
    const int attn_floats = 3 * d + kShortMaxSeq + (int)((size_t)2 * max_seq * d * es / 4);
    const int region = std::max(std::max(std::max(hidden, inter), hq * d), std::max(2 * vocab, attn_floats));
    return launch_cp<uint16_t>(a, region, Q3T_STREAM(stream));
#else
    (void)dtype, (void)layer_ptrs, (void)n_layers, (void)heads, (void)inputs, (void)input_dtype, (void)first, (void)last;
    (void)hidden, (void)inter, (void)hq, (void)hkv, (void)d, (void)max_seq, (void)vocab, (void)eps, (void)scale;
    (void)final_norm, (void)cos_tab, (void)sin_tab, (void)x, (void)qkv, (void)attn, (void)mlp, (void)logits, (void)codes;
    (void)flags, (void)temperature, (void)top_k, (void)top_p, (void)slot, (void)params, (void)seed_ptr, (void)step_ptr;
    (void)sync, (void)trace, (void)stream;
    return q3t_fail("q3t_cp_passes: CUDA sm_90 only (HIP has no TMA bulk copies)");
#endif
}
