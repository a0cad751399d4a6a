// The codec decoder's activation (model/codec.py, _SnakeBeta): y = x + inv_beta[c] * sin(x * alpha[c])^2 per
// channel c, one read and one write of the activation where torch's five ops make ~11 passes over it. The
// vocoder runs it 29 times a call on its largest tensors (96 channels at 24 kHz): a call of 16 streams by 12
// frames took 33.6 ms of GPU on torch's ops and 23.9 on this kernel (H100, kernels/device/profile_codec.py). Each op is rounded to the tensor's dtype as torch rounds it (products and
// the sum with explicit rounding, so nothing is contracted into an FMA), so the samples equal torch's.
#include "common.cuh"

namespace {
constexpr int kThreads = 256;
constexpr int kPerThread = 4;  // elements a thread handles, blockDim apart: loads in flight

template <typename T> struct Round;
template <> struct Round<float> {
    __device__ static __forceinline__ float op(float v) { return v; }
};
template <> struct Round<uint16_t> {
    __device__ static __forceinline__ float op(float v) { return bf16_to_f32(f32_to_bf16(v)); }
};

template <typename T>
__device__ __forceinline__ float snake_beta(float x, float alpha, float inv_beta) {
    const float t = Round<T>::op(__fmul_rn(x, alpha));
    const float s = Round<T>::op(sinf(t));
    const float p = Round<T>::op(__fmul_rn(s, s));
    const float m = Round<T>::op(__fmul_rn(inv_beta, p));
    return __fadd_rn(x, m);  // rounded by the store
}

// Row blockIdx.x = b * channels + c of x [batch, channels, t] (last stride 1), chunk blockIdx.y of its t.
template <typename T>
__global__ void k_snake_beta(const T* __restrict__ x, long long x_batch, long long x_channel,
                             const T* __restrict__ alpha, const T* __restrict__ inv_beta, T* __restrict__ y,
                             long long y_batch, long long y_channel, int channels, int t) {
    const int b = blockIdx.x / channels, c = blockIdx.x % channels;
    const float a = Elem<T>::load(alpha, c), ib = Elem<T>::load(inv_beta, c);
    const T* xr = x + b * x_batch + c * x_channel;
    T* yr = y + b * y_batch + c * y_channel;
    const int first = blockIdx.y * (kThreads * kPerThread) + threadIdx.x;
    float v[kPerThread];
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
        const int i = first + j * kThreads;
        v[j] = i < t ? Elem<T>::load(xr, i) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
        const int i = first + j * kThreads;
        if (i < t) Elem<T>::store(yr, i, snake_beta<T>(v[j], a, ib));
    }
}
}  // namespace

extern "C" Q3T_API int q3t_snake_beta(int dtype, const void* x, long long x_batch, long long x_channel,
                                      const void* alpha, const void* inv_beta, void* y, long long y_batch,
                                      long long y_channel, int batch, int channels, int t, void* stream) {
    if (!x || !alpha || !inv_beta || !y || batch <= 0 || channels <= 0 || t <= 0 ||
        (long long)batch * channels > 0x7fffffffLL)
        return q3t_fail("q3t_snake_beta: bad arguments");
    const long long chunks = ((long long)t + kThreads * kPerThread - 1) / (kThreads * kPerThread);
    if (chunks > 65535) return q3t_fail("q3t_snake_beta: %d samples a row is too many", t);
    const dim3 grid(batch * channels, (unsigned)chunks);
    cudaStream_t s = Q3T_STREAM(stream);
    // A plain launch: the codec's other kernels are torch's, with nothing to overlap under PDL.
    if (dtype == Q3T_F32)
        k_snake_beta<float><<<grid, kThreads, 0, s>>>(static_cast<const float*>(x), x_batch, x_channel,
                                                     static_cast<const float*>(alpha), static_cast<const float*>(inv_beta),
                                                     static_cast<float*>(y), y_batch, y_channel, channels, t);
    else if (dtype == Q3T_BF16)
        k_snake_beta<uint16_t><<<grid, kThreads, 0, s>>>(
            static_cast<const uint16_t*>(x), x_batch, x_channel, static_cast<const uint16_t*>(alpha),
            static_cast<const uint16_t*>(inv_beta), static_cast<uint16_t*>(y), y_batch, y_channel, channels, t);
    else
        return q3t_fail("q3t_snake_beta: unknown dtype %d", dtype);
    return q3t_check_launch("q3t_snake_beta");
}
