// Timeout reports without printf, for kernels that issue wgmma. Any call to
// vprintf anywhere in a kernel makes ptxas serialise every wgmma in it (warning
// C7510): the Hopper-builder fused kernels ran 11-35% slower than the same
// engine alone for that reason (ncu, 2026-11-30). Translation units built with
// KOSMOS_TIMEOUT_MAILBOX (the sm_90a library, CMakeLists.txt) therefore report a
// timed-out wait by writing a record into mapped host memory and trapping; a host
// thread (csrc/timeout_mailbox.cu) prints it to stderr as the same line printf
// would have printed. Other kernels printf (kosmos/sync.h).
#pragma once
#include <cstdint>

#include "kosmos/platform.h"

namespace kosmos {

constexpr int kTimeoutNameLen = 32;
constexpr int kTimeoutSlots = 4;  // records per (device, translation unit); later timeouts only trap

// One report, written by the device, read by the host. Fixed layout (plain data).
struct TimeoutRecord {
  uint32_t ready;  // 0 empty; 1 written by the device; 2 printed by the host
  int32_t rank, cta, index;
  uint64_t expected, seen, after_ms;
  char kernel[kTimeoutNameLen];
  char flag[kTimeoutNameLen];
};

#if defined(KOSMOS_TIMEOUT_MAILBOX) && defined(KOSMOS_CUDA)
// This translation unit's kTimeoutSlots records on this device (one copy of the
// variable per TU and device); null until the host sets them: then trap only.
static __device__ TimeoutRecord* g_timeout_records;
static __device__ unsigned g_timeout_claims;

KOSMOS_DEVICE void copy_name(volatile char* dst, const char* src) {
  int i = 0;
  for (; src != nullptr && src[i] != 0 && i < kTimeoutNameLen - 1; ++i) dst[i] = src[i];
  dst[i] = 0;
}

// Writes the record (when a slot is free), then traps. Inlined: a call here
// would be the very function call that serialises wgmma.
[[noreturn]] KOSMOS_DEVICE void report_timeout(const char* kernel, int rank, int cta, const char* flag, int index,
                                               uint64_t expected, uint64_t seen, uint64_t after_ms) {
  TimeoutRecord* const recs = g_timeout_records;
  const unsigned i = recs != nullptr ? atomicAdd(&g_timeout_claims, 1u) : kTimeoutSlots;
  if (i < (unsigned)kTimeoutSlots) {
    volatile TimeoutRecord* r = recs + i;
    r->rank = rank, r->cta = cta, r->index = index;
    r->expected = expected, r->seen = seen, r->after_ms = after_ms;
    copy_name(r->kernel, kernel);
    copy_name(r->flag, flag);
    __threadfence_system();  // the fields reach host memory before `ready` does
    r->ready = 1;
    __threadfence_system();
  }
  trap();
}

// Host side, in the same translation unit as the kernels (the variable is
// per TU): point the current device's copy at `records` (mapped host memory,
// kTimeoutSlots of them).
static inline cudaError_t set_timeout_mailbox(TimeoutRecord* records) {
  return cudaMemcpyToSymbol(g_timeout_records, &records, sizeof records);
}
#endif

}  // namespace kosmos
