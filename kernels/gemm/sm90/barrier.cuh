// Hopper CTA-local synchronisation used by the tile engine: mbarriers (the
// TMA completion mechanism and our producer/consumer handshakes), named
// barriers among a subset of warps, and register reallocation between warp
// groups. Raw PTX, so the schedule above stays ours.
#pragma once
#include <cstdint>
#include <cstdio>

#include "kosmos/platform.h"
#include "kosmos/timeout_mailbox.h"

namespace kosmos::sm90 {

// A wait that never completes is a bug; trap with a message instead of hanging
// the GPU (DESIGN.md §4, bounded waits). Engine-internal waits can be long only
// while a fused kernel's hook waits on peers, which has its own timeout.
constexpr uint64_t kWaitTimeoutNs = 10ull * 1000 * 1000 * 1000;

KOSMOS_DEVICE uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

KOSMOS_DEVICE void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Makes mbarrier inits visible to the async proxy (TMA completes on them)
// before any thread uses them; follow with a CTA barrier.
KOSMOS_DEVICE void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// One arrival (release at CTA scope: the arriving thread's earlier shared
// stores are visible to whoever completes a wait on this phase).
KOSMOS_DEVICE void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// The producer's arrival for a stage: announce the bytes TMA will deliver, so
// the phase completes only when they have landed.
KOSMOS_DEVICE void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

KOSMOS_DEVICE bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Waits until the phase with this parity has completed (acquire at CTA scope).
// A fresh barrier counts its "previous" phase (parity 1) as complete, which is
// what lets a producer start by waiting on parity 1 of an empty-slot barrier.
//
// On timeout it traps (the launch fails instead of hanging). It never printfs:
// any call to vprintf in the kernel makes ptxas serialise every wgmma (warning
// C7510). Where the host set up a mailbox (kosmos/timeout_mailbox.h: the fused
// kernels) the report goes there first; KOSMOS_SM90_LOUD_WAITS printfs instead
// (a debug build that accepts the slowdown).
//
// sleep_ns > 0 (a waiter whose latency matters little: the engine's publisher)
// naps between polls, so its warp leaves the issue slots it shares with a
// consumer warp to that warp.
KOSMOS_DEVICE void mbar_wait(uint64_t* bar, uint32_t parity, const char* what, uint32_t sleep_ns = 0) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t t0 = now_ns();
  for (uint32_t spins = 1;; ++spins) {
    if (sleep_ns != 0) __nanosleep(sleep_ns);
    if (mbar_try_wait(bar, parity)) return;
    if ((spins & 1023u) == 0 && now_ns() - t0 > kWaitTimeoutNs) {
#if defined(KOSMOS_SM90_LOUD_WAITS)
      printf("kosmos sm90 tile engine: timeout on %s (parity %u), block %d thread %d\n", what, parity,
             (int)blockIdx.x, (int)threadIdx.x);
      trap();
#elif defined(KOSMOS_TIMEOUT_MAILBOX)
      report_timeout("sm90 tile engine", -1, (int)blockIdx.x, what, (int)threadIdx.x, parity, parity ^ 1,
                     kWaitTimeoutNs / 1000000ull);
#else
      (void)what;
      trap();
#endif
    }
  }
}

// Barrier among `threads` threads (a multiple of 32) that use the same id;
// id 0 is __syncthreads, so engines use ids from 1.
KOSMOS_DEVICE void named_barrier(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Arrive without waiting: the other side of a named_barrier(id, threads).
KOSMOS_DEVICE void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Warp-group register reallocation: the TMA producer needs few registers, the
// WGMMA consumers hold a 64x256 fp32 accumulator each (128 per thread).
template <uint32_t kRegs>
KOSMOS_DEVICE void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
KOSMOS_DEVICE void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// Named barrier ids of the tile engine (0 is __syncthreads'): its consumer
// warp groups alone, and the whole CTA as the producer takes registers back.
constexpr uint32_t kConsumerBarrier = 1, kRegsBackBarrier = 2;

// Position in a ring of n slots (stages, mailboxes) and the phase parity of
// the slot's mbarrier.
struct Ring {
  int slot = 0;
  uint32_t phase = 0;
  KOSMOS_DEVICE void advance(int n) {
    if (++slot == n) slot = 0, phase ^= 1;
  }
};

}  // namespace kosmos::sm90
