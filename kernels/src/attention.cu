// GQA decode attention of one query position over the static KV cache (flash-decoding):
// the context is cut into `splits` chunks, one block per (q head, chunk) keeps an online
// softmax per warp (one key per warp per step, lanes over head dims), then a second kernel
// merges the chunks. Softmax statistics and accumulation are float32.
#include "common.cuh"

namespace {
constexpr int kThreads = 256;  // 8 warps: a 16-key CodePredictor context takes two steps per warp
constexpr int kMaxD = 256;

template <typename C>
__global__ void __launch_bounds__(kThreads) k_attn_partial(const float* __restrict__ q, const C* __restrict__ kc,
                                                           const C* __restrict__ vc, const int* __restrict__ pos_ptr,
                                                           int pos_add, int hq, int hkv, int d, int max_seq,
                                                           float scale, int splits, float* __restrict__ scratch,
                                                           float* __restrict__ direct) {
    q3t_grid_dep();
    constexpr int kPer = kMaxD / Q3T_WARP;  // head dims per lane, upper bound
    __shared__ float sm_m[kThreads / 32], sm_l[kThreads / 32];
    __shared__ float sm_acc[kThreads / 32][kMaxD];
    const int h = blockIdx.x, split = blockIdx.y;
    const int kvh = h / (hq / hkv);
    const int lane = threadIdx.x % Q3T_WARP, warp = threadIdx.x / Q3T_WARP, nwarps = blockDim.x / Q3T_WARP;
    int pos = read_pos(pos_ptr, pos_add);
    pos = pos < 0 ? 0 : (pos >= max_seq ? max_seq - 1 : pos);
    const int len = pos + 1;
    const int chunk = (len + splits - 1) / splits;
    const int begin = split * chunk, end = min(len, begin + chunk);

    float qr[kPer], acc[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int i = lane + j * Q3T_WARP;
        qr[j] = i < d ? q[(size_t)h * d + i] : 0.f;
        acc[j] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int t = begin + warp; t < end; t += nwarps) {
        const C* krow = kc + ((size_t)t * hkv + kvh) * d;
        const C* vrow = vc + ((size_t)t * hkv + kvh) * d;
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            const int i = lane + j * Q3T_WARP;
            if (i < d) s += qr[j] * Elem<C>::load(krow, i);
        }
        s = warp_sum(s) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
        const float p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            const int i = lane + j * Q3T_WARP;
            if (i < d) acc[j] = acc[j] * corr + p * Elem<C>::load(vrow, i);
        }
        m = m_new;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int i = lane + j * Q3T_WARP;
        if (i < d) sm_acc[warp][i] = acc[j];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < nwarps; ++w) M = fmaxf(M, sm_m[w]);
    if (direct) {  // one chunk: this block has the whole softmax, write the result (no merge pass)
        float L = 0.f;
        for (int w = 0; w < nwarps; ++w) L += sm_m[w] == -INFINITY ? 0.f : sm_l[w] * expf(sm_m[w] - M);
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float a = 0.f;
            for (int w = 0; w < nwarps; ++w)
                if (sm_m[w] != -INFINITY) a += sm_acc[w][i] * expf(sm_m[w] - M);
            direct[(size_t)h * d + i] = a / L;
        }
        return;
    }
    float* out = scratch + ((size_t)h * splits + split) * (d + 2);
    if (M == -INFINITY) {  // empty chunk
        if (threadIdx.x == 0) {
            out[0] = -INFINITY;
            out[1] = 0.f;
        }
        for (int i = threadIdx.x; i < d; i += blockDim.x) out[2 + i] = 0.f;
        return;
    }
    float L = 0.f;
    for (int w = 0; w < nwarps; ++w) L += sm_m[w] == -INFINITY ? 0.f : sm_l[w] * expf(sm_m[w] - M);
    if (threadIdx.x == 0) {
        out[0] = M;
        out[1] = L;
    }
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float a = 0.f;
        for (int w = 0; w < nwarps; ++w)
            if (sm_m[w] != -INFINITY) a += sm_acc[w][i] * expf(sm_m[w] - M);
        out[2 + i] = a;
    }
}

__global__ void __launch_bounds__(kThreads) k_attn_merge(const float* __restrict__ scratch, int d, int splits,
                                                         float* __restrict__ out) {
    q3t_grid_dep();
    const int h = blockIdx.x;
    const float* base = scratch + (size_t)h * splits * (d + 2);
    float M = -INFINITY;
    for (int s = 0; s < splits; ++s) M = fmaxf(M, base[(size_t)s * (d + 2)]);
    float L = 0.f;
    for (int s = 0; s < splits; ++s) {
        const float ms = base[(size_t)s * (d + 2)];
        if (ms != -INFINITY) L += base[(size_t)s * (d + 2) + 1] * expf(ms - M);
    }
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float a = 0.f;
        for (int s = 0; s < splits; ++s) {
            const float ms = base[(size_t)s * (d + 2)];
            if (ms != -INFINITY) a += base[(size_t)s * (d + 2) + 2 + i] * expf(ms - M);
        }
        out[(size_t)h * d + i] = a / L;
    }
}
}  // namespace

extern "C" Q3T_API int q3t_attention(int dtype, const float* q, const void* k_cache, const void* v_cache,
                                     const int* pos_ptr, int pos_add, int hq, int hkv, int d, int max_seq, float scale,
                                     int splits, float* scratch, float* out, void* stream) {
    if (!q || !k_cache || !v_cache || !out || (splits > 1 && !scratch)) return q3t_fail("q3t_attention: null pointer");
    if (hq <= 0 || hkv <= 0 || hq % hkv || d <= 0 || d > kMaxD || splits <= 0 || splits > 1024 || max_seq <= 0)
        return q3t_fail("q3t_attention: bad shape hq=%d hkv=%d d=%d splits=%d", hq, hkv, d, splits);
    cudaStream_t s = Q3T_STREAM(stream);
    const dim3 grid(hq, splits);
    if (dtype == Q3T_F32)
        q3t_launch(k_attn_partial<float>, grid, kThreads, 0, s, q, static_cast<const float*>(k_cache),
                                                        static_cast<const float*>(v_cache), pos_ptr, pos_add, hq, hkv,
                                                        d, max_seq, scale, splits, scratch,
                                                        splits == 1 ? out : nullptr);
    else if (dtype == Q3T_BF16)
        q3t_launch(k_attn_partial<uint16_t>, grid, kThreads, 0, s, q, static_cast<const uint16_t*>(k_cache),
                                                           static_cast<const uint16_t*>(v_cache), pos_ptr, pos_add, hq,
                                                           hkv, d, max_seq, scale, splits, scratch,
                                                        splits == 1 ? out : nullptr);
    else
        return q3t_fail("q3t_attention: unknown dtype %d", dtype);
    if (q3t_check_launch("q3t_attention (partial)")) return -1;
    if (splits == 1) return 0;
    q3t_launch(k_attn_merge, hq, kThreads, 0, s, scratch, d, splits, out);
    return q3t_check_launch("q3t_attention (merge)");
}

// ---------------------------------------------------------------------------------------------
// Short contexts (the CodePredictor's 16 positions): q/k RMSNorm + RoPE + KV append + attention
// in one kernel, one block per q head (attention_short.cuh), instead of q3t_qk_norm_rope_append
// followed by q3t_attention: one launch less per CodePredictor layer and position.
#include "attention_short.cuh"

namespace {
constexpr int kShortThreads = 256;

template <typename C>
__global__ void __launch_bounds__(kShortThreads) k_rope_attention(
    const float* __restrict__ qkv, const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, const int* __restrict__ pos_ptr, int pos_add,
    int hq, int hkv, int d, int max_seq, float scale, C* k_cache, C* v_cache, float* __restrict__ out) {
    extern __shared__ float4 sm4[];  // short_smem_bytes<C>(d, max_seq)
    __shared__ float red[32];
    float* sm = reinterpret_cast<float*>(sm4);
    C* hist = reinterpret_cast<C*>(sm + 3 * d + kShortMaxSeq);
    // Before the wait: the position (a frame counter or a constant, set long before), the K/V
    // rows of earlier positions and the head's constants; none is written by the kernel before.
    int pos = read_pos(pos_ptr, pos_add);
    pos = pos < 0 ? 0 : (pos >= max_seq ? max_seq - 1 : pos);  // never outside the cache
    const int h = blockIdx.x;
    short_history<C>(k_cache, v_cache, pos, h / (hq / hkv), hkv, d, hist);
    const ShortConsts k = short_head_consts(qn, kn, cos_tab, sin_tab, pos, d);
    q3t_grid_dep();
    short_head<C>(qkv, k, eps, pos, h, hq, hkv, d, scale, k_cache, v_cache, hist, out, sm, red);
}
}  // namespace

extern "C" Q3T_API int q3t_rope_attention(int dtype, const float* qkv, const float* q_norm_w, const float* k_norm_w,
                                          float eps, const float* cos_tab, const float* sin_tab, const int* pos_ptr,
                                          int pos_add, int hq, int hkv, int d, int max_seq, float scale,
                                          void* k_cache, void* v_cache, float* out, void* stream) {
    if (!qkv || !q_norm_w || !k_norm_w || !cos_tab || !sin_tab || !k_cache || !v_cache || !out)
        return q3t_fail("q3t_rope_attention: null pointer");
    if (hq <= 0 || hkv <= 0 || hq % hkv || d <= 0 || d > kShortThreads || d % 2 || max_seq <= 0 ||
        max_seq > kShortMaxSeq || max_seq * d > kShortMaxElems)
        return q3t_fail("q3t_rope_attention: bad shape hq=%d hkv=%d d=%d max_seq=%d (d <= %d, max_seq <= %d, "
                        "max_seq * d <= %d)", hq, hkv, d, max_seq, kShortThreads, kShortMaxSeq, kShortMaxElems);
    cudaStream_t s = Q3T_STREAM(stream);
    const size_t smem = dtype == Q3T_F32 ? short_smem_bytes<float>(d, max_seq) : short_smem_bytes<uint16_t>(d, max_seq);
    if (dtype == Q3T_F32)
        q3t_launch(k_rope_attention<float>, hq, kShortThreads, smem, s, qkv, q_norm_w, k_norm_w, eps, cos_tab, sin_tab,
                   pos_ptr, pos_add, hq, hkv, d, max_seq, scale, static_cast<float*>(k_cache),
                   static_cast<float*>(v_cache), out);
    else if (dtype == Q3T_BF16)
        q3t_launch(k_rope_attention<uint16_t>, hq, kShortThreads, smem, s, qkv, q_norm_w, k_norm_w, eps, cos_tab,
                   sin_tab, pos_ptr, pos_add, hq, hkv, d, max_seq, scale, static_cast<uint16_t*>(k_cache),
                   static_cast<uint16_t*>(v_cache), out);
    else
        return q3t_fail("q3t_rope_attention: unknown dtype %d", dtype);
    return q3t_check_launch("q3t_rope_attention");
}
