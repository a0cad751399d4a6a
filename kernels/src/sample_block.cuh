// Logits processing and one draw, as device code for one block (q3t_sample's kernel, sampling.cu).
// Order as the reference (transformers' processors): repetition penalty ->
// min-new-tokens EOS mask -> suppressed ids -> (sampling) temperature -> top-k -> top-p -> draw.
// Greedy picks the lowest index among equal maxima, as torch.argmax does. Draws come from
// Philox4x32-10 keyed by the seed and counted by (frame, code group), so a seeded run is
// reproducible and independent of launch timing (draw_bits: the caller computes them; step is the
// frame counter, used by the min-new-tokens mask too).
#pragma once

#include "common.cuh"

constexpr int kSampleMaxV = 4096;  // largest vocabulary one block samples

struct Philox {
    // Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11), 10 rounds.
    __device__ static uint4 run(uint4 c, uint2 k) {
#pragma unroll
        for (int r = 0; r < 10; ++r) {
            const uint32_t lo0 = 0xD2511F53u * c.x, hi0 = __umulhi(0xD2511F53u, c.x);
            const uint32_t lo1 = 0xCD9E8D57u * c.z, hi1 = __umulhi(0xCD9E8D57u, c.z);
            c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
            k.x += 0x9E3779B9u;
            k.y += 0xBB67AE85u;
        }
        return c;
    }
};

// The draw's random bits: Philox of (step, stream) keyed by the seed. Read and computed before the
// logits are (q3t_sample: before its PDL wait), so the draw pays no round trip for them at its end.
__device__ __forceinline__ uint32_t draw_bits(const unsigned long long* __restrict__ seed_ptr, int stream_id, int step) {
    const unsigned long long seed = seed_ptr ? *seed_ptr : 0ull;
    return Philox::run(make_uint4((uint32_t)step, (uint32_t)stream_id, 0u, 0u),
                       make_uint2((uint32_t)seed, (uint32_t)(seed >> 32)))
        .x;
}

__device__ __forceinline__ uint32_t order_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Exclusive prefix sum of one value per thread over the block (fixed order: deterministic).
template <typename T>
__device__ T block_exclusive_scan(T v, T* sm, T* total) {
    const int lane = threadIdx.x % Q3T_WARP, warp = threadIdx.x / Q3T_WARP;
    const int nwarps = blockDim.x / Q3T_WARP;
    T incl = v;
#pragma unroll
    for (int o = 1; o < Q3T_WARP; o <<= 1) {
        const T n = Q3T_SHFL(incl, (lane - o) < 0 ? 0 : lane - o);
        if (lane >= o) incl += n;
    }
    __syncthreads();
    if (lane == Q3T_WARP - 1) sm[warp] = incl;
    __syncthreads();
    T before = 0, all = 0;
    for (int w = 0; w < nwarps; ++w) {
        if (w < warp) before += sm[w];
        all += sm[w];
    }
    *total = all;
    return before + incl - v;
}

// The whole of q3t_sample for one block of THREADS threads (every thread must call it; every thread
// gets the drawn id back). L and cand are shared-memory scratch of v floats and v ints.
//
// Barriers are what a one-block draw waits on (16 draws per frame on the critical path), so the
// sampled path has few: the logits' maximum is reduced in the first pass, the top-k select's
// histograms alternate between two buffers (no clearing pass), the top-k filter is a comparison
// in the draw rather than a pass over L, and the inverse-CDF draw runs over L in id order (each
// thread a contiguous run) without compacting the survivors first, except under top-p, whose
// sort-free rule needs the candidate list.
template <int THREADS>
__device__ int sample_block(const float* __restrict__ logits, int v, unsigned char* __restrict__ seen, float penalty,
                            int eos, int min_new, int sup_lo, int sup_hi, int flags, float temperature, int top_k,
                            float top_p, int step, uint32_t bits, int* __restrict__ out_code, float* L, int* cand) {
    static_assert(kSampleMaxV % THREADS == 0, "THREADS must divide kSampleMaxV");
    __shared__ float wsum[32];
    __shared__ int isum[32];
    __shared__ unsigned hist[2][256];
    __shared__ float redv[32];
    __shared__ int redi[32];
    __shared__ uint32_t sel_prefix;
    __shared__ int sel_need, sel_whole, chosen, last_alive;
    const int tid = threadIdx.x;
    const int lane = tid % Q3T_WARP, warp = tid / Q3T_WARP;
    const int nwarps = (int)(blockDim.x / Q3T_WARP);

    // Sampling divides by the temperature here, last of the processors, as its own pass would.
    const bool sampling = (flags & Q3T_SAMPLE_DO_SAMPLE) != 0;
    const float inv_t = temperature > 0.f ? temperature : 1.0f;
    float tmax = -INFINITY;
    for (int i = tid; i < v; i += blockDim.x) {
        float x = q3t_ld_act(logits + i);
        if (seen && penalty != 1.0f && seen[i]) x = x < 0.f ? x * penalty : x / penalty;
        if (eos >= 0 && i == eos && step < min_new) x = -INFINITY;
        if (i >= sup_lo && i < sup_hi && i != eos) x = -INFINITY;
        L[i] = sampling ? x / inv_t : x;
        tmax = fmaxf(tmax, L[i]);
    }
    if (sampling) {
        // The maximum (the softmax's shift; the top-k filter never removes it) and the select's
        // state, ready at the barrier that ends this pass.
        tmax = warp_max(tmax);
        if (lane == 0) redv[warp] = tmax;
        if (tid == 0) {
            sel_prefix = 0;
            sel_need = top_k;
            sel_whole = 0;
            chosen = 0x7fffffff;
            last_alive = -1;
        }
        for (int i = tid; i < 256; i += blockDim.x) hist[0][i] = 0;
    }
    __syncthreads();

    if (!sampling) {
        float best = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = tid; i < v; i += blockDim.x)
            if (L[i] > best) {  // strided ascending: the first max seen is this thread's lowest index
                best = L[i];
                bi = i;
            }
        // Block argmax with ties to the lowest index; every thread reads the warps' results.
        for (int m = Q3T_WARP / 2; m > 0; m >>= 1) {
            const float ob = Q3T_SHFL_XOR(best, m);
            const int oi = Q3T_SHFL_XOR(bi, m);
            if (ob > best || (ob == best && oi < bi)) {
                best = ob;
                bi = oi;
            }
        }
        if (lane == 0) {
            redv[warp] = best;
            redi[warp] = bi;
        }
        __syncthreads();
        float b = -INFINITY;
        int id = 0x7fffffff;
        for (int w = 0; w < nwarps; ++w)
            if (redv[w] > b || (redv[w] == b && redi[w] < id)) {
                b = redv[w];
                id = redi[w];
            }
        const int pick = id == 0x7fffffff ? 0 : id;  // all -inf cannot happen with valid inputs
        if (tid == 0) {
            *out_code = pick;
            if (seen) seen[pick] = 1;
        }
        return pick;
    }

    float mx = -INFINITY;
    for (int w = 0; w < nwarps; ++w) mx = fmaxf(mx, redv[w]);
    float kth = -INFINITY;  // ids with L >= kth (and not -inf) survive top-k
    if (top_k > 0 && top_k < v) {
        // Radix select of the top_k-th largest value, 8 bits at a time from the top. It stops
        // early when the bin it lands in is taken whole (the k-th value is then the bin's
        // smallest, and no value outside the bin lies between it and the bin's lower edge, so
        // the edge filters the same ids): 0.012-0.015 ms off a frame of 16 draws on the H200.
        for (int shift = 24, pass = 0; shift >= 0; shift -= 8, ++pass) {
            unsigned* h = hist[pass & 1];
            // The next pass's bins: their last reader (warp 0, the pass before) is past a barrier.
            for (int i = tid; i < 256; i += blockDim.x) hist[(pass + 1) & 1][i] = 0;
            const uint32_t hi_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
            const uint32_t prefix = sel_prefix;
            for (int i = tid; i < v; i += blockDim.x) {
                const uint32_t k = order_key(L[i]);
                if ((k & hi_mask) == (prefix & hi_mask)) atomicAdd(&h[(k >> shift) & 255u], 1u);
            }
            const int need = sel_need;  // read before the barrier: lane `tid` of warp 0 rewrites it below
            __syncthreads();
            if (tid < Q3T_WARP) {
                // Find the bin, from the top, where the running count reaches `need`: each lane
                // owns 256 / warp consecutive bins (in descending order), a warp scan finds the lane.
                constexpr int kBins = 256 / Q3T_WARP;
                int own = 0;
#pragma unroll
                for (int r = 0; r < kBins; ++r) own += (int)h[255 - (tid * kBins + r)];
                int incl = own;
#pragma unroll
                for (int o = 1; o < Q3T_WARP; o <<= 1) {
                    const int n = Q3T_SHFL(incl, tid - o < 0 ? 0 : tid - o);
                    if (tid >= o) incl += n;
                }
                int before = incl - own;
                if (before < need && need <= incl) {
                    int b = 255 - tid * kBins;
                    for (int r = 0; r < kBins; ++r, --b) {
                        if (before + (int)h[b] >= need) break;
                        before += (int)h[b];
                    }
                    sel_prefix = prefix | ((uint32_t)b << shift);
                    sel_need = need - before;
                    sel_whole = need - before == (int)h[b];
                }
            }
            __syncthreads();
            if (sel_whole) break;  // the same for every thread: read after the barrier
        }
        kth = key_value(sel_prefix);  // ties with the k-th value stay, as in transformers
    }
    if (top_p < 1.0f) {
        // transformers' TopP: sort ascending, drop ids whose cumulative probability is
        // <= 1 - top_p, keep the most likely one. Equivalently, drop id i when the mass of
        // the ids ranked above it is >= top_p. O(n^2) over the top-k survivors, compacted in
        // ascending id order (each thread owns a contiguous run); only when on. Dropped ids
        // become -inf in L.
        const int per = (v + blockDim.x - 1) / blockDim.x;
        const int lo = tid * per, hi = min(v, lo + per);
        int cnt = 0;
        for (int i = lo; i < hi; ++i) cnt += L[i] >= kth && L[i] != -INFINITY;
        int n_cand = 0;
        int at = block_exclusive_scan<int>(cnt, isum, &n_cand);
        for (int i = lo; i < hi; ++i)
            if (L[i] >= kth && L[i] != -INFINITY) cand[at++] = i;
        __syncthreads();
        float z = 0.f;
        for (int c = tid; c < n_cand; c += blockDim.x) z += expf(L[cand[c]] - mx);
        z = block_sum(z, wsum);
        bool drop[kSampleMaxV / THREADS];
#pragma unroll
        for (int r = 0; r < kSampleMaxV / THREADS; ++r) {
            const int c = tid + r * THREADS;
            drop[r] = false;
            if (c >= n_cand) continue;
            const int i = cand[c];
            const float li = L[i];
            float above = 0.f;
            for (int e = 0; e < n_cand; ++e) {
                const int j = cand[e];
                const float lj = L[j];
                if (lj > li || (lj == li && j > i)) above += expf(lj - mx);
            }
            drop[r] = above > 0.f && (1.0f - above / z) <= (1.0f - top_p);
        }
        __syncthreads();  // everyone has read L before it is marked
#pragma unroll
        for (int r = 0; r < kSampleMaxV / THREADS; ++r) {
            const int c = tid + r * THREADS;
            if (c < n_cand && drop[r]) L[cand[c]] = -INFINITY;
        }
        __syncthreads();
    }
    // Inverse-CDF draw over the survivors in id order, each thread a contiguous run of ids.
    const int per = (v + blockDim.x - 1) / blockDim.x;
    const int lo = tid * per, hi = min(v, lo + per);
    float part = 0.f;
    int mine_last = -1;
    for (int i = lo; i < hi; ++i) {
        const float li = L[i];
        if (li >= kth && li != -INFINITY) {
            part += expf(li - mx);
            mine_last = i;
        }
    }
    if (mine_last >= 0) atomicMax(&last_alive, mine_last);  // seen after the scan's barriers
    float z = 0.f;
    float run = block_exclusive_scan<float>(part, wsum, &z);
    const float target = (float)(bits >> 8) * (1.0f / 16777216.0f) * z;
    for (int i = lo; i < hi; ++i) {
        const float li = L[i];
        if (li >= kth && li != -INFINITY) {
            run += expf(li - mx);
            if (run > target) {
                atomicMin(&chosen, i);
                break;
            }
        }
    }
    __syncthreads();
    // Rounding may leave the target above the total: then the highest survivor.
    int pick = chosen != 0x7fffffff ? chosen : last_alive;
    if (pick < 0 || pick >= v) pick = 0;  // no survivor cannot happen with valid inputs
    if (tid == 0) {
        *out_code = pick;
        if (seen) seen[pick] = 1;
    }
    return pick;
}

// The drawn code's row of an embedding table (`row_dtype`) as float32 into row_out, block-wide: the
// next CodePredictor input, written by the draw itself (one launch, and one dependent step of the
// frame, fewer than q3t_embed_row after it).
__device__ __forceinline__ void copy_drawn_row(int row_dtype, const void* __restrict__ row_table, int row_rows,
                                               int row_h, int tok, float* __restrict__ row_out) {
    if (row_dtype == Q3T_BF16)
        copy_embedding_row(static_cast<const uint16_t*>(row_table), row_rows, row_h, tok, row_out, threadIdx.x, blockDim.x);
    else
        copy_embedding_row(static_cast<const float*>(row_table), row_rows, row_h, tok, row_out, threadIdx.x, blockDim.x);
}
