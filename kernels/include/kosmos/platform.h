// Single-source CUDA/HIP shim: every arch-specific spelling the kernels need
// (launch attributes, vector types, timers) is mapped here and nowhere else.
#pragma once

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#define KOSMOS_HIP 1
using kosmosStream_t = hipStream_t;
using kosmosError_t = hipError_t;
#define kosmosSuccess hipSuccess
#define kosmosGetLastError hipGetLastError
#define kosmosGetErrorString hipGetErrorString
#else
#include <cuda_runtime.h>
#define KOSMOS_CUDA 1
using kosmosStream_t = cudaStream_t;
using kosmosError_t = cudaError_t;
#define kosmosSuccess cudaSuccess
#define kosmosGetLastError cudaGetLastError
#define kosmosGetErrorString cudaGetErrorString
#endif

#define KOSMOS_HD __host__ __device__
#define KOSMOS_DEVICE __device__ __forceinline__

namespace kosmos {

// 16-byte vector: the widest single load/store both vendors issue from a thread,
// and the unit of every peer copy.
struct alignas(16) Vec16 {
  unsigned int w[4];
};
constexpr int kVecBytes = 16;

}  // namespace kosmos
