// The SwiGLU glue around the vendor BLAS's matrix products of a batched step at 32 or more streams
// (backends/kernels/gemm.py: cuBLAS or hipBLASLt through torch, bf16 inputs on tensor cores): the gate/up
// product's float32 rows into the down projection's float32 and bf16 inputs. (The other glue, rows made bf16
// and RMS-normalised on the way, is norm.cu's.) The rows are a few KB: the launch is the cost, not the bytes.
#include "common.cuh"

namespace {
constexpr int kThreads = 256;

// gate_up [rows, 2 n] (gate and up interleaved, weights.py) into y [rows, n] as float32 and as bf16 (the down
// projection's input): silu(g) * u, in float32 as the GEMVs' SwiGLU mode does it. Block (x, row) takes outputs
// [2 kThreads x, 2 kThreads (x + 1)) of its row, two a thread from one float4 (g0, u0, g1, u1): many blocks,
// so the 64 rows of a step spread over the GPU instead of queueing on 64 SMs.
__global__ void __launch_bounds__(kThreads) k_swiglu_pairs(const float4* __restrict__ gate_up, float2* __restrict__ y,
                                                           uint32_t* __restrict__ y_bf16, int n2) {
    q3t_grid_dep_trigger_first();
    const int i = blockIdx.x * kThreads + threadIdx.x;
    if (i >= n2) return;
    const size_t at = (size_t)blockIdx.y * n2 + i;
    const float4 v = gate_up[at];
    const float a = (v.x / (1.0f + expf(-v.x))) * v.y;
    const float b = (v.z / (1.0f + expf(-v.z))) * v.w;
    y[at] = make_float2(a, b);
    y_bf16[at] = f32x2_to_bf16x2(a, b);
}

// The same for an odd n, one output at a time (block x of row y).
__global__ void __launch_bounds__(kThreads) k_swiglu(const float2* __restrict__ gate_up, float* __restrict__ y,
                                                     uint16_t* __restrict__ y_bf16, int n) {
    q3t_grid_dep_trigger_first();
    const int i = blockIdx.x * kThreads + threadIdx.x;
    if (i >= n) return;
    const size_t at = (size_t)blockIdx.y * n + i;
    const float2 v = gate_up[at];
    const float s = (v.x / (1.0f + expf(-v.x))) * v.y;
    y[at] = s;
    y_bf16[at] = f32_to_bf16(s);
}
}  // namespace

extern "C" Q3T_API int q3t_batched_swiglu(const float* gate_up, float* y, void* y_bf16, int n, int rows,
                                          void* stream) {
    if (!gate_up || !y || !y_bf16 || n <= 0 || rows < 1 || rows > 2 * Q3T_BATCH_MAX)
        return q3t_fail("q3t_batched_swiglu: bad arguments (n=%d rows=%d)", n, rows);
    cudaStream_t s = Q3T_STREAM(stream);
    const bool pairs = n % 2 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(y) % 8 == 0 && reinterpret_cast<uintptr_t>(y_bf16) % 4 == 0;
    if (pairs) {
        const int n2 = n / 2;
        q3t_launch(k_swiglu_pairs, dim3((n2 + kThreads - 1) / kThreads, rows), kThreads, 0, s,
                   reinterpret_cast<const float4*>(gate_up), reinterpret_cast<float2*>(y), static_cast<uint32_t*>(y_bf16), n2);
    } else {
        q3t_launch(k_swiglu, dim3((n + kThreads - 1) / kThreads, rows), kThreads, 0, s,
                   reinterpret_cast<const float2*>(gate_up), y, static_cast<uint16_t*>(y_bf16), n);
    }
    return q3t_check_launch("q3t_batched_swiglu");
}
