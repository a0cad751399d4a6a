// Vendor map: the kernels are written once against CUDA names; under HIP (hipcc, AMD) this
// header maps those names to the HIP runtime. It also fixes the warp (wavefront) width:
// 32 on NVIDIA and RDNA (wave32), 64 on gfx9 (GCN / CDNA). Nothing else in kernels/src includes a
// vendor runtime header directly.
#pragma once

#include <stdint.h>

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) && !defined(__CUDACC__)
#define Q3T_HIP 1
#include <hip/hip_runtime.h>

#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaStream_t hipStream_t
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString
#define cudaGetDevice hipGetDevice
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaFuncAttributes hipFuncAttributes
#define cudaFuncGetAttributes hipFuncGetAttributes
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor

// Wavefront width as a compile-time constant (array sizes, unrolled shuffle ladders). clang
// deprecates __AMDGCN_WAVEFRONT_SIZE (on gfx10+ the width is a run-time choice of the code
// object), so it follows from the target family instead: gfx9 (GCN, CDNA: gfx90a, gfx942) runs
// wave64 only; gfx10/11/12 (RDNA) compile wave32, HIP's default there (the build never passes
// -mwavefrontsize64). The host pass (no __GFX*__ macro) sees 32; no kernel signature depends on it,
// and the launchers size their grids from the device's warpSize (q3t_init).
#if defined(__GFX9__)
#define Q3T_WARP 64
#else
#define Q3T_WARP 32
#endif

// Q3T_LAUNCH_BOUNDS(threads, blocks): at most `threads` per block, and registers few enough that
// `blocks` blocks fit on one SM (CUDA) at once (0: no minimum). HIP's second __launch_bounds__
// argument counts waves per SIMD (amdgpu_waves_per_eu), not blocks; the unit a block runs on, and
// what multiProcessorCount counts, is a CU on CDNA and a WGP (two CUs, WGP mode, the default) on
// RDNA, 4 SIMDs either way, so `blocks` blocks are blocks * threads / (4 * wave) waves per SIMD.
#define Q3T_LAUNCH_BOUNDS(threads, blocks) \
    __launch_bounds__(threads, ((blocks) * (threads) + 4 * Q3T_WARP - 1) / (4 * Q3T_WARP))

// HIP shuffles take no mask and are wavefront-wide.
#define Q3T_SHFL_XOR(v, m) __shfl_xor((v), (m), Q3T_WARP)
#define Q3T_SHFL(v, l) __shfl((v), (l), Q3T_WARP)

#else
#define Q3T_CUDA 1
#include <cuda_runtime.h>
#define Q3T_WARP 32
#define Q3T_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
#define Q3T_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), 32)
#define Q3T_SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l), 32)
#endif
