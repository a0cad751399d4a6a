// Vendor map: the kernels are written once against CUDA names; under HIP (hipcc, AMD) this
// header maps those names to the HIP runtime. It also fixes the warp (wavefront) width:
// 32 on NVIDIA and RDNA (wave32), 64 on CDNA (gfx9xx). Nothing else in kernels/src includes a
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

// Wavefront width is a compile-time property of the target: __AMDGCN_WAVEFRONT_SIZE is 64 on
// gfx9 (CDNA, e.g. gfx942) and 32 on gfx10+/gfx11/gfx12 (RDNA; wave32 is the HIP default there).
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define Q3T_WARP __AMDGCN_WAVEFRONT_SIZE
#elif defined(__GFX9__)
#define Q3T_WARP 64
#else
#define Q3T_WARP 32
#endif

// HIP shuffles take no mask and are wavefront-wide.
#define Q3T_SHFL_XOR(v, m) __shfl_xor((v), (m), Q3T_WARP)
#define Q3T_SHFL(v, l) __shfl((v), (l), Q3T_WARP)

#else
#define Q3T_CUDA 1
#include <cuda_runtime.h>
#define Q3T_WARP 32
#define Q3T_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), 32)
#define Q3T_SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l), 32)
#endif
