// Trivial device copy: the kernel behind the kosmos_copy FFI target, which proves
// the build -> load -> register -> ffi_call chain before any fused kernel exists.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kosmos/platform.h"

namespace kosmos {

constexpr int kCopyThreads = 256;

// Bulk in 16-byte vectors when both pointers allow it, the tail byte by byte.
__global__ void copy_kernel(unsigned char* __restrict__ dst,
                            const unsigned char* __restrict__ src, size_t bytes) {
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const bool aligned = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % kVecBytes) == 0;
  const size_t nvec = aligned ? bytes / kVecBytes : 0;
  auto* d = reinterpret_cast<Vec16*>(dst);
  auto* s = reinterpret_cast<const Vec16*>(src);
  for (size_t i = tid; i < nvec; i += stride) d[i] = s[i];
  for (size_t i = nvec * kVecBytes + tid; i < bytes; i += stride) dst[i] = src[i];
}

inline kosmosError_t launch_copy(void* dst, const void* src, size_t bytes, kosmosStream_t stream) {
  if (bytes == 0) return kosmosSuccess;
  const size_t vecs = (bytes + kVecBytes - 1) / kVecBytes;
  size_t blocks = (vecs + kCopyThreads - 1) / kCopyThreads;
  if (blocks > 1024) blocks = 1024;
  copy_kernel<<<(unsigned)blocks, kCopyThreads, 0, stream>>>(
      static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), bytes);
  return kosmosGetLastError();
}

}  // namespace kosmos
