// The heap's data region (kHeapDataOffset on) is shared by every fused op and
// group: AG's gather slots and RS's fp32 staging overlap. HeapUse (ag_layout.h)
// records its last writer; a launch overwrites the region only after every
// reader of that writer's launch released done[reader] >= that epoch. Each
// launch waits on its predecessor's readers, so by induction no older reader
// remains, whichever op or group the predecessor was.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kosmos/platform.h"
#include "kosmos/sync.h"
#include "tp/ag_layout.h"

namespace kosmos {

#ifdef KOSMOS_GPU
// Thread 0 only: waits until the last writer's readers are done. `site` names the
// caller for the timeout report; its index becomes the reader's rank.
KOSMOS_DEVICE void heap_use_wait(char* heap, uint64_t timeout_ns, WaitSite site) {
  const volatile HeapUse* use = reinterpret_cast<const volatile HeapUse*>(heap + kHeapUseOffset);
  const uint64_t off = use->done_off, ep = use->epoch;
  if (off == 0) return;  // never written
  const int tp = (int)use->tp, me = (int)use->rank;
  const uint64_t* done = reinterpret_cast<const uint64_t*>(heap + off);
  for (int r = 0; r < tp; ++r) {
    if (r == me) continue;
    site.index = r;
    wait_ge<Scope::kSys>(&done[r], ep, timeout_ns, site);
  }
}

// Thread 0 of the last CTA, after its reads of peers are done: this launch wrote
// the region in `epoch`; its readers (the group's other ranks) release
// done[r] at heap + done_off.
KOSMOS_DEVICE void heap_use_record(char* heap, size_t done_off, uint64_t epoch, int tp, int rank) {
  volatile HeapUse* use = reinterpret_cast<volatile HeapUse*>(heap + kHeapUseOffset);
  use->done_off = done_off;
  use->epoch = epoch;
  use->tp = (uint32_t)tp;
  use->rank = (uint32_t)rank;
}
#endif

}  // namespace kosmos
