// Claimable work queue: a counter in device memory; claim() hands out the next
// index in queue order. Queue order is the schedule (DESIGN.md §5), so a CTA
// that claims index i knows every index < i was claimed before it, by a CTA
// that is running. The counter is reset by the kernel's last CTA, never the host.
#pragma once
#include <cstdint>

#include "kosmos/platform.h"

namespace kosmos {

struct WorkQueue {
  uint32_t* next;  // device-memory counter, zero at kernel start
  uint32_t size;   // number of items; claims past it mean "queue empty"

  // Relaxed: the item's data is synchronised by its own flag, not by the claim.
  KOSMOS_HD uint32_t claim() const { return claim_u32(next); }
  // Whether item i has been handed out (a stale read only says "not yet").
  KOSMOS_HD bool claimed(uint32_t i) const { return ld_relaxed_u32(next) > i; }
};

}  // namespace kosmos
