// Per-head q/k RMSNorm + rotate-half RoPE + KV-cache append, one block per head.
// Blocks 0..hq-1 handle q heads, hq..hq+hkv-1 k heads, then hkv blocks copy v into the cache.
#include "common.cuh"

namespace {
constexpr int kThreads = 128;  // >= head_dim / 2 is not needed: threads stride over the head

template <typename C>
__global__ void __launch_bounds__(kThreads) k_qk_norm_rope_append(
    const float* __restrict__ qkv, const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ cos_tab, const float* __restrict__ sin_tab, const int* __restrict__ pos_ptr, int pos_add,
    int hq, int hkv, int d, int max_seq, float* __restrict__ q_out, C* __restrict__ k_cache, C* __restrict__ v_cache) {
    q3t_grid_dep_trigger_first();
    __shared__ float red[32];
    __shared__ float hv[512];
    const int head = blockIdx.x;
    int pos = read_pos(pos_ptr, pos_add);
    pos = pos < 0 ? 0 : (pos >= max_seq ? max_seq - 1 : pos);  // never write outside the cache
    const float* src = qkv + (size_t)head * d;  // q heads, then k heads, then v heads: contiguous
    if (head >= hq + hkv) {  // v: plain copy
        C* dst = v_cache + ((size_t)pos * hkv + (head - hq - hkv)) * d;
        for (int i = threadIdx.x; i < d; i += blockDim.x) Elem<C>::store(dst, i, src[i]);
        return;
    }
    const bool is_q = head < hq;
    const float* nw = is_q ? qn : kn;
    float ss = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = src[i];
        ss += v * v;
    }
    const float r = rsqrtf(block_sum(ss, red) / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) hv[i] = nw[i] * (src[i] * r);
    __syncthreads();
    const int half = d / 2;
    const float* c = cos_tab + (size_t)pos * d;
    const float* s = sin_tab + (size_t)pos * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        // x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[half:], x[:half]); two roundings
        // like torch's separate multiplies (no fused multiply-add), so float32 matches closely.
        const float rot = i < half ? -hv[i + half] : hv[i - half];
        const float o = __fadd_rn(__fmul_rn(hv[i], c[i]), __fmul_rn(rot, s[i]));
        if (is_q)
            q_out[(size_t)head * d + i] = o;
        else
            Elem<C>::store(k_cache + ((size_t)pos * hkv + (head - hq)) * d, i, o);
    }
}
}  // namespace

extern "C" Q3T_API int q3t_qk_norm_rope_append(int dtype, const float* qkv, const float* q_norm_w,
                                               const float* k_norm_w, float eps, const float* cos_tab,
                                               const float* sin_tab, const int* pos_ptr, int pos_add, int hq, int hkv,
                                               int d, int max_seq, float* q_out, void* k_cache, void* v_cache,
                                               void* stream) {
    if (!qkv || !q_norm_w || !k_norm_w || !cos_tab || !sin_tab || !q_out || !k_cache || !v_cache)
        return q3t_fail("q3t_qk_norm_rope_append: null pointer");
    if (hq <= 0 || hkv <= 0 || hq % hkv || d <= 0 || d > 512 || d % 2 || max_seq <= 0)
        return q3t_fail("q3t_qk_norm_rope_append: bad shape hq=%d hkv=%d d=%d max_seq=%d", hq, hkv, d, max_seq);
    const dim3 grid(hq + 2 * hkv);
    cudaStream_t s = Q3T_STREAM(stream);
    if (dtype == Q3T_F32)
        q3t_launch(k_qk_norm_rope_append<float>, grid, kThreads, 0, s, qkv, q_norm_w, k_norm_w, eps, cos_tab, sin_tab, pos_ptr,
                                                               pos_add, hq, hkv, d, max_seq, q_out,
                                                               static_cast<float*>(k_cache), static_cast<float*>(v_cache));
    else if (dtype == Q3T_BF16)
        q3t_launch(k_qk_norm_rope_append<uint16_t>, grid, kThreads, 0, s,
            qkv, q_norm_w, k_norm_w, eps, cos_tab, sin_tab, pos_ptr, pos_add, hq, hkv, d, max_seq, q_out,
            static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache));
    else
        return q3t_fail("q3t_qk_norm_rope_append: unknown dtype %d", dtype);
    return q3t_check_launch("q3t_qk_norm_rope_append");
}
