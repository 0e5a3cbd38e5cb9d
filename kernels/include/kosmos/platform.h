// Single-source CUDA/HIP shim: every arch-specific spelling the kernels need
// (launch types, vector types, atomics with scopes, timers, trap) is mapped here
// and nowhere else. Compiled by a plain C++ compiler (no __CUDACC__/__HIPCC__),
// the same names map to host atomics so the schedulers can be emulated on the CPU.
#pragma once
#include <cstdint>

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define KOSMOS_HIP 1
#define KOSMOS_GPU 1
using kosmosStream_t = hipStream_t;
using kosmosError_t = hipError_t;
#define kosmosSuccess hipSuccess
#define kosmosGetLastError hipGetLastError
#define kosmosGetErrorString hipGetErrorString
#elif defined(__CUDACC__)
#include <cuda_runtime.h>
#define KOSMOS_CUDA 1
#define KOSMOS_GPU 1
using kosmosStream_t = cudaStream_t;
using kosmosError_t = cudaError_t;
#define kosmosSuccess cudaSuccess
#define kosmosGetLastError cudaGetLastError
#define kosmosGetErrorString cudaGetErrorString
#else
#define KOSMOS_HOST_EMU 1
#endif
#include <chrono>
#include <cstdio>
#include <cstdlib>

#ifdef KOSMOS_GPU
#define KOSMOS_HD __host__ __device__
#define KOSMOS_DEVICE __device__ __forceinline__
#else
#define KOSMOS_HD
#define KOSMOS_DEVICE inline
#endif

namespace kosmos {

// 16-byte vector: the widest single load/store both vendors issue from a thread,
// and the unit of every peer copy.
struct alignas(16) Vec16 {
  unsigned int w[4];
};
constexpr int kVecBytes = 16;

// ---- atomics and flags --------------------------------------------------------
// Flags are 64-bit epochs. Producers publish with a release store at the scope
// of the farthest reader (.sys when a peer GPU reads it, .gpu otherwise);
// consumers read with an acquire load of the same scope, so data written
// before the release is visible after the acquire (PTX memory model).
#if defined(KOSMOS_CUDA) && defined(__CUDA_ARCH__)
KOSMOS_DEVICE uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
KOSMOS_DEVICE uint64_t ld_acquire_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
KOSMOS_DEVICE void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
KOSMOS_DEVICE void st_release_gpu(uint64_t* p, uint64_t v) {
  asm volatile("st.release.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Queue claims only hand out indices; the data behind an index is synchronised
// by its flag, so the claim itself can be relaxed.
KOSMOS_DEVICE uint32_t claim_u32(uint32_t* p) { return atomicAdd(p, 1u); }
KOSMOS_DEVICE uint32_t ld_relaxed_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// CTA-finish counter: acq_rel so the last CTA sees every other CTA's work.
KOSMOS_DEVICE uint32_t add_acq_rel_gpu_u32(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
KOSMOS_DEVICE uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
[[noreturn]] KOSMOS_DEVICE void trap() { __trap(); __builtin_unreachable(); }
#elif defined(KOSMOS_HIP) && defined(__HIP_DEVICE_COMPILE__)
KOSMOS_DEVICE uint64_t ld_acquire_sys(const uint64_t* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
KOSMOS_DEVICE uint64_t ld_acquire_gpu(const uint64_t* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}
KOSMOS_DEVICE void st_release_sys(uint64_t* p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
KOSMOS_DEVICE void st_release_gpu(uint64_t* p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}
KOSMOS_DEVICE uint32_t claim_u32(uint32_t* p) {
  return __hip_atomic_fetch_add(p, 1u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
KOSMOS_DEVICE uint32_t ld_relaxed_u32(const uint32_t* p) {
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
KOSMOS_DEVICE uint32_t add_acq_rel_gpu_u32(uint32_t* p, uint32_t v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT);
}
// wall_clock64 ticks at a constant 100 MHz on CDNA3 (MI300).
KOSMOS_DEVICE uint64_t now_ns() { return wall_clock64() * 10ull; }
[[noreturn]] KOSMOS_DEVICE void trap() { __builtin_trap(); }
#else
// Host code (the CPU emulation, and nvcc's host pass over the same headers):
// the same orders through the compiler's atomic builtins. KOSMOS_HD because
// clang's HIP host pass type-checks __device__ callers against these too.
KOSMOS_HD inline uint64_t ld_acquire_sys(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
KOSMOS_HD inline uint64_t ld_acquire_gpu(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
KOSMOS_HD inline void st_release_sys(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
KOSMOS_HD inline void st_release_gpu(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
KOSMOS_HD inline uint32_t claim_u32(uint32_t* p) { return __atomic_fetch_add(p, 1u, __ATOMIC_RELAXED); }
KOSMOS_HD inline uint32_t ld_relaxed_u32(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
KOSMOS_HD inline uint32_t add_acq_rel_gpu_u32(uint32_t* p, uint32_t v) {
  return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}
KOSMOS_HD inline uint64_t now_ns() {
  return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}
[[noreturn]] KOSMOS_HD inline void trap() { std::fflush(stdout); std::abort(); }
#endif

}  // namespace kosmos
