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

#if defined(KOSMOS_HIP) && defined(__HIP_DEVICE_COMPILE__)
// HIP device pass: __host__ __device__ helpers are forced inline as well, as
// KOSMOS_DEVICE ones are. clang kept kosmos::timeout_trap (sync.h) out of line
// for gfx942/gfx950, and since it takes its WaitSite by reference every wait
// then stored the site's four fields to scratch before spinning (28 scratch
// stores in ag_tn_kernel, 432 B of scratch per lane). Inlined, the fields stay
// in registers and the kernels' own code touches no scratch; what remains is the
// printf of an expired wait, which clang lowers to calls into the device
// library (docs/hip.md has the measurements on gfx90a, gfx942 and gfx950).
#define KOSMOS_HD __host__ __device__ __attribute__((always_inline))
#define KOSMOS_DEVICE __device__ __forceinline__
#elif defined(KOSMOS_GPU)
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
// HIP: the same orders and scopes through clang's scoped atomic builtins; the
// AMDGPU backend's memory model (LLVM AMDGPUUsage, "Memory Model GFX942")
// expands each into cache-control bits and cache write-back / invalidate
// instructions. What each mapping compiles to is written beside it, as
// generated for gfx942 and gfx950 by clang 22 and for gfx90a by ROCm 5.2's
// clang (tests/test_hip_memory_model.py pins these sequences; docs/hip.md has
// the review). Scopes: SYSTEM covers peer GPUs and the host, AGENT one GPU,
// which on MI300X/MI355X is eight XCDs with an L2 each, so even agent scope
// writes back / invalidates L2 lines (sc1), unlike NVIDIA's .gpu.
//
// Premise for every .sys flag below: the symmetric heap is fine-grained memory
// on AMD (hipExtMallocWithFlags(..., hipDeviceMallocFinegrained), or uncached).
// HIP makes coarse-grained memory (plain hipMalloc) coherent across devices
// only at kernel boundaries; no fence inside a persistent kernel can stand in
// for that. The HIP host side does not exist yet; it must allocate so.

// gfx942/gfx950: global_load sc0 sc1; s_waitcnt vmcnt(0); buffer_inv sc0 sc1.
// gfx90a:        global_load glc;     s_waitcnt vmcnt(0); buffer_invl2; buffer_wbinvl1_vol.
// sc0 sc1 makes the load system-coherent (it misses this CU's L1 and any L2
// line that may be stale with respect to another agent), so the peer's release
// store is seen. The wait puts the invalidate after the load has returned, and
// buffer_inv sc0 sc1 drops this CU's L1 and the L2's lines of other agents'
// memory: the plain loads that follow (load_cg is a plain load on HIP; pulls
// read peers' rows with it) cannot hit data cached before the flag was seen.
// The invalidate is per CU, so other threads of the CTA that read after the
// acquiring thread's __syncthreads() read through invalidated caches too.
// Cost: every poll iteration of wait_ge (sync.h) pays the invalidate; polling
// relaxed and acquiring once after the flag is seen would not (docs/hip.md).
KOSMOS_DEVICE uint64_t ld_acquire_sys(const uint64_t* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
// gfx942/gfx950: global_load sc1; s_waitcnt vmcnt(0); buffer_inv sc1.
// gfx90a:        global_load glc; s_waitcnt vmcnt(0); buffer_wbinvl1_vol.
// Agent scope: coherent across the XCDs of this GPU (sc1) and invalidating
// this CU's L1 and the L2's lines that another XCD may have written; for the
// flags only this GPU's CTAs release (arrived[] after a pull, band counts).
KOSMOS_DEVICE uint64_t ld_acquire_gpu(const uint64_t* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}
// gfx942/gfx950: buffer_wbl2 sc0 sc1; s_waitcnt vmcnt(0); global_store sc0 sc1.
// gfx90a:        buffer_wbl2;         s_waitcnt vmcnt(0); global_store.
// The write-back pushes this L2's dirty lines (data this thread, or its CTA
// before the caller's __syncthreads(), stored with plain stores: pushed rows in
// a peer's heap, partials a peer will pull) out to memory; vmcnt(0) waits for
// those stores and the write-back to complete before the flag store issues,
// and sc0 sc1 writes the flag through to memory where the peer's sc0 sc1 load
// reads it. The CTA's other waves' stores are ordered before this wave's
// write-back by the barrier: on gfx942 clang emits no vmcnt wait at a
// workgroup-scope __syncthreads() (one L1 per CU, not tgsplit), so this relies
// on the backend's memory model for that cumulativity; an MI300 litmus test of
// push + flag is the check still owed (docs/hip.md).
KOSMOS_DEVICE void st_release_sys(uint64_t* p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
// gfx942/gfx950: buffer_wbl2 sc1; s_waitcnt vmcnt(0); global_store sc1.
// gfx90a:        s_waitcnt vmcnt(0); global_store (one L2 per GPU: nothing to write back).
// On MI300X the eight XCD L2s are not coherent with each other for ordinary
// lines, hence the agent-scope write-back that NVIDIA's st.release.gpu has no
// counterpart of.
KOSMOS_DEVICE void st_release_gpu(uint64_t* p, uint64_t v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}
// gfx942/gfx950: global_atomic_add sc0; gfx90a: global_atomic_add glc (both
// bits mean "return the old value"). RMW atomics bypass L1 and are performed
// in L2 (system scope would add sc1); relaxed, so no write-back or invalidate.
// The atomic optimizer also folds a wave's lanes into one atomic (v_mbcnt);
// the kernels claim from one thread anyway. Relaxed is enough, as on CUDA: a
// claim hands out an index, the data behind it is ordered by its own flag.
KOSMOS_DEVICE uint32_t claim_u32(uint32_t* p) {
  return __hip_atomic_fetch_add(p, 1u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
// gfx942/gfx950: global_load sc1 (agent-coherent, skips a stale L1 line); no
// fence. gfx90a: global_load glc.
KOSMOS_DEVICE uint32_t ld_relaxed_u32(const uint32_t* p) {
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
// gfx942/gfx950: buffer_wbl2 sc1; s_waitcnt; global_atomic_add sc0;
//                s_waitcnt vmcnt(0); buffer_inv sc1.
// gfx90a:        s_waitcnt; global_atomic_add glc; s_waitcnt vmcnt(0); buffer_wbinvl1_vol.
// Release half (write-back before the add) publishes this CTA's work, acquire
// half (invalidate after it returns) lets the last CTA read every other CTA's.
KOSMOS_DEVICE uint32_t add_acq_rel_gpu_u32(uint32_t* p, uint32_t v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT);
}
// s_memrealtime on all three targets: the constant "wall clock" (100 MHz on
// MI200/MI300; the runtime reports it as hipDeviceAttributeWallClockRate, which
// the HIP host side should check before trusting the factor 10), not the shader
// clock, which varies with the core's frequency.
KOSMOS_DEVICE uint64_t now_ns() { return wall_clock64() * 10ull; }
// s_trap 2: the wave halts and the runtime reports the kernel as failed.
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

// ---- groups of 32 lanes ---------------------------------------------------------
// Steps that rank or broadcast across lanes (the MoE plan's scatter, its fold)
// run on aligned groups of 32 lanes: a CUDA warp, or either half of an AMD
// wavefront of 64. Width 32 keeps a half's shuffles inside that half, so code
// that numbers lanes threadIdx.x % 32 means the same on both; no step uses the
// upper 32 lanes of a wavefront as lanes of the lower group. Every lane of the
// group calls these together (converged); masks have bit l for the group's lane l.
#if defined(KOSMOS_CUDA)
KOSMOS_DEVICE int lanes32_shfl(int v, int src) { return __shfl_sync(0xffffffffu, v, src, 32); }
KOSMOS_DEVICE float lanes32_shfl(float v, int src) { return __shfl_sync(0xffffffffu, v, src, 32); }
// Bit l set where the group's lane l holds the same v (match.any, sm_70 and later).
KOSMOS_DEVICE unsigned lanes32_match(int v) { return __match_any_sync(0xffffffffu, v); }
// The group's shared-memory accesses before it happen before those after it.
KOSMOS_DEVICE void lanes32_sync() { __syncwarp(); }
#elif defined(KOSMOS_HIP)
KOSMOS_DEVICE int lanes32_shfl(int v, int src) { return __shfl(v, src, 32); }
KOSMOS_DEVICE float lanes32_shfl(float v, int src) { return __shfl(v, src, 32); }
// AMD has no match instruction: one shuffle (ds_bpermute) per lane of the group.
KOSMOS_DEVICE unsigned lanes32_match(int v) {
  unsigned same = 0;
  for (int l = 0; l < 32; ++l) same |= (unsigned)(__shfl(v, l, 32) == v) << l;
  return same;
}
// A wavefront issues its LDS accesses in program order, so only the compiler
// could reorder them across lanes' steps: wavefront-scope fences around a wave
// barrier forbid that (ROCm's own __syncwarp, which HIP 5.2 lacks, is this).
KOSMOS_DEVICE void lanes32_sync() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
#endif

// ---- L2 prefetch hint -----------------------------------------------------------
// Bring [p, p + bytes) into L2 (p 16-byte aligned, bytes a multiple of 16) with
// no registers held and nothing to wait for: sm_90's bulk prefetch, a request
// the TMA unit carries out while the thread goes on. Elsewhere nothing (a hint:
// the loads that follow read the same bytes either way).
KOSMOS_DEVICE void l2_prefetch(const void* p, int bytes) {
#if defined(KOSMOS_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

// ---- asynchronous 16-byte copies into shared memory ------------------------------
// sm_80+: cp.async.cg, a global -> shared copy through L2 only (never a stale L1
// line; no register held while it flies), in groups the issuing thread commits
// and later waits for; the wait covers that thread's own copies only. Elsewhere
// a plain 16-byte copy, done when the call returns, and the group calls are
// nothing. smem and gmem 16-byte aligned.
#if defined(KOSMOS_GPU)
KOSMOS_DEVICE void async_copy16(void* smem, const void* gmem) {
#if defined(KOSMOS_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem)
               : "memory");
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}
KOSMOS_DEVICE void async_commit() {
#if defined(KOSMOS_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
KOSMOS_DEVICE void async_wait() {
#if defined(KOSMOS_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}
#endif

}  // namespace kosmos
