// q/k RMSNorm + rotate-half RoPE at `pos`, K/V append and attention over cache positions 0..pos,
// one block per q head (blocks loop over heads when there are fewer): the short-context decode
// attention of the CodePredictor (16 positions), shared by q3t_rope_attention (attention.cu) and
// the persistent CodePredictor (code_predictor.cu).
// The block of the first q head of each KV group writes the cache row; every block uses its own
// copy of the new K/V, rounded to the cache dtype as the split path reads it back from the cache.
// sm: shared scratch of 3 d + kShortMaxSeq floats; red: 32 floats. Needs d <= blockDim.x.
#pragma once

#include "common.cuh"

constexpr int kShortMaxSeq = 64;  // positions one block scores (one float each in shared memory)

template <typename C>
__device__ __forceinline__ float round_to(float v) {
    return v;
}
template <>
__device__ __forceinline__ float round_to<uint16_t>(float v) {
    return bf16_to_f32(f32_to_bf16(v));
}

template <typename C>
__device__ void rope_attention_heads(const float* qkv, const float* __restrict__ qn, const float* __restrict__ kn,
                                     float eps, const float* __restrict__ cos_tab, const float* __restrict__ sin_tab,
                                     int pos, int hq_, int hkv_, int d_, float scale, C* kc, C* vc, float* out,
                                     float* sm, float* red) {
    const int d = d_, hq = hq_, hkv = hkv_, group = hq / hkv;
    const int tid = threadIdx.x, lane = tid % Q3T_WARP, warp = tid / Q3T_WARP, nwarps = blockDim.x / Q3T_WARP;
    float* qs = sm;
    float* ks = sm + d;
    float* vs = sm + 2 * d;
    float* sc = sm + 3 * d;  // kShortMaxSeq scores
    const float* c = cos_tab + (size_t)pos * d;
    const float* sn = sin_tab + (size_t)pos * d;
    const int half = d / 2;
    for (int h = blockIdx.x; h < hq; h += gridDim.x) {
        const int kvh = h / group;
        const float* qsrc = qkv + (size_t)h * d;
        const float* ksrc = qkv + (size_t)(hq + kvh) * d;
        const float* vsrc = qkv + (size_t)(hq + hkv + kvh) * d;
        float sq = 0.f, sk = 0.f;
        for (int i = tid; i < d; i += blockDim.x) {
            const float a = q3t_ld_act(qsrc + i), b = q3t_ld_act(ksrc + i);
            qs[i] = a;
            ks[i] = b;
            vs[i] = round_to<C>(q3t_ld_act(vsrc + i));
            sq += a * a;
            sk += b * b;
        }
        const float rq = rsqrtf(block_sum(sq, red) / (float)d + eps);
        const float rk = rsqrtf(block_sum(sk, red) / (float)d + eps);
        for (int i = tid; i < d; i += blockDim.x) {
            qs[i] = qn[i] * (qs[i] * rq);
            ks[i] = kn[i] * (ks[i] * rk);
        }
        __syncthreads();
        float qo = 0.f, ko = 0.f;
        if (tid < d) {
            const int i = tid;
            const float qr = i < half ? -qs[i + half] : qs[i - half];
            const float kr = i < half ? -ks[i + half] : ks[i - half];
            qo = __fadd_rn(__fmul_rn(qs[i], c[i]), __fmul_rn(qr, sn[i]));
            ko = round_to<C>(__fadd_rn(__fmul_rn(ks[i], c[i]), __fmul_rn(kr, sn[i])));
        }
        __syncthreads();
        if (tid < d) {
            qs[tid] = qo;
            ks[tid] = ko;
            if (h % group == 0) {
                const size_t at = ((size_t)pos * hkv + kvh) * d + tid;
                Elem<C>::store(kc, (int)at, ko);
                Elem<C>::store(vc, (int)at, vs[tid]);
            }
        }
        __syncthreads();
        for (int t = warp; t <= pos; t += nwarps) {
            float s = 0.f;
            const C* krow = kc + ((size_t)t * hkv + kvh) * d;
            for (int i = lane; i < d; i += Q3T_WARP) s += qs[i] * (t == pos ? ks[i] : q3t_ld_act_f(krow, i));
            s = warp_sum(s);
            if (lane == 0) sc[t] = s * scale;
        }
        __syncthreads();
        float m = -INFINITY;
        for (int t = 0; t <= pos; ++t) m = fmaxf(m, sc[t]);
        float l = 0.f;
        for (int t = 0; t <= pos; ++t) l += expf(sc[t] - m);
        for (int i = tid; i < d; i += blockDim.x) {
            float a = 0.f;
            for (int t = 0; t <= pos; ++t) {
                const float v = t == pos ? vs[i] : q3t_ld_act_f(vc + ((size_t)t * hkv + kvh) * d, i);
                a += expf(sc[t] - m) * v;
            }
            out[(size_t)h * d + i] = a / l;
        }
        __syncthreads();  // qs/ks/vs/sc are reused by the next head of this block
    }
}
