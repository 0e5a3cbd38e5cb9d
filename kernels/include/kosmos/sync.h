// Flags and bounded waits. A flag holds the epoch at which its data was last
// published; epochs only grow (advanced by the kernels, never reset by the host),
// so "ready" is `flag >= epoch` and a CUDA-graph replay needs no host reset.
// Every spin is bounded: on timeout it names kernel, rank, CTA, flag, index and
// the expected and seen values, then traps, so a hang becomes an error.
#pragma once
#include <cstdint>
#ifndef KOSMOS_HOST_EMU
#include <cstdio>
#endif

#include "kosmos/platform.h"
#include "kosmos/timeout_mailbox.h"

namespace kosmos {

enum class Scope : int { kGpu = 0, kSys = 1 };

// Where a wait happens, for the timeout report.
struct WaitSite {
  const char* kernel;
  int rank;
  int cta;
  const char* flag;
  int index;
};

template <Scope S>
KOSMOS_HD inline uint64_t load_acquire(const uint64_t* p) {
  return S == Scope::kSys ? ld_acquire_sys(p) : ld_acquire_gpu(p);
}

template <Scope S>
KOSMOS_HD inline void store_release(uint64_t* p, uint64_t v) {
  if (S == Scope::kSys) st_release_sys(p, v); else st_release_gpu(p, v);
}

#if defined(KOSMOS_HIP) && defined(__HIP_DEVICE_COMPILE__)
// HIP: the report is one cold function taken by value. The HIP device pass
// inlines every KOSMOS_HD function (platform.h), and inlined at every wait the
// printf became ~10 calls per site and a WaitSite spilled to scratch inside the
// poll loops; out of line, a wait passes scalars in registers and the loops keep
// no scratch and no call (docs/hip.md).
[[noreturn]] __device__ __attribute__((noinline, cold)) inline void timeout_report(
    const char* kernel, int rank, int cta, const char* flag, int index, uint64_t expected, uint64_t seen,
    uint64_t after_ms) {
  printf("kosmos timeout: kernel=%s rank=%d cta=%d flag=%s[%d] expected>=%llu seen=%llu after %llu ms\n", kernel,
         rank, cta, flag, index, (unsigned long long)expected, (unsigned long long)seen, (unsigned long long)after_ms);
  trap();
}
#endif

// Reports a wait that timed out (what it waited for, the value it expected and
// the one it saw) and traps: printf, or the mailbox in wgmma kernels
// (kosmos/timeout_mailbox.h), or (HIP) the cold report above.
[[noreturn]] KOSMOS_HD inline void timeout_trap(const WaitSite& site, uint64_t expected, uint64_t seen,
                                                uint64_t timeout_ns) {
#if defined(KOSMOS_HIP) && defined(__HIP_DEVICE_COMPILE__)
  timeout_report(site.kernel, site.rank, site.cta, site.flag, site.index, expected, seen, timeout_ns / 1000000ull);
#elif defined(KOSMOS_TIMEOUT_MAILBOX) && defined(__CUDA_ARCH__)
  report_timeout(site.kernel, site.rank, site.cta, site.flag, site.index, expected, seen, timeout_ns / 1000000ull);
#else
  printf("kosmos timeout: kernel=%s rank=%d cta=%d flag=%s[%d] expected>=%llu seen=%llu after %llu ms\n",
         site.kernel, site.rank, site.cta, site.flag, site.index, (unsigned long long)expected,
         (unsigned long long)seen, (unsigned long long)(timeout_ns / 1000000ull));
  trap();
#endif
}

// Spins (one thread) until *flag >= expected; returns the value seen. The clock is
// read only every 256 polls so the poll loop stays tight.
template <Scope S>
KOSMOS_HD inline uint64_t wait_ge(const uint64_t* flag, uint64_t expected, uint64_t timeout_ns,
                                  const WaitSite& site) {
  const uint64_t start = now_ns();
  for (uint32_t spin = 1;; ++spin) {
    const uint64_t seen = load_acquire<S>(flag);
    if (seen >= expected) return seen;
    if ((spin & 255u) == 0 && now_ns() - start > timeout_ns) {
      timeout_trap(site, expected, seen, timeout_ns);
    }
  }
}

// This launch's epoch: one past the last completed one. Every CTA reads it at
// its start, before any CTA can finish and advance it (the last CTA does, after
// every CTA has counted itself finished), so all CTAs agree without a barrier.
KOSMOS_HD inline uint64_t launch_epoch(const uint64_t* last_done) {
  return *reinterpret_cast<const volatile uint64_t*>(last_done) + 1;
}

}  // namespace kosmos
