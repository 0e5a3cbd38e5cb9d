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
// Thread 0 only: waits until every peer r of a group of tp (all but `rank`) has
// released done[r] >= epoch. `site` names the caller for the timeout report;
// its index becomes the peer's rank.
KOSMOS_DEVICE void wait_peers_done(const uint64_t* done, uint64_t epoch, int tp, int rank, uint64_t timeout_ns,
                                   WaitSite site) {
  for (int r = 0; r < tp; ++r) {
    if (r == rank) continue;
    site.index = r;
    wait_ge<Scope::kSys>(&done[r], epoch, timeout_ns, site);
  }
}

// Thread 0 only: waits until the last writer's readers are done.
KOSMOS_DEVICE void heap_use_wait(char* heap, uint64_t timeout_ns, WaitSite site) {
  const volatile HeapUse* use = reinterpret_cast<const volatile HeapUse*>(heap + kHeapUseOffset);
  const uint64_t off = use->done_off, ep = use->epoch;
  if (off == 0) return;  // never written
  wait_peers_done(reinterpret_cast<const uint64_t*>(heap + off), ep, (int)use->tp, (int)use->rank, timeout_ns, site);
}

// Direct sources (ag_nn, bulk_ag_nn, bulk_rs_nt), thread 0: tells the peers
// where they read our operand this epoch, `at` (0: the copies we make in the
// heap), in *src_ptr, released by *src_epoch. It rewrites the address only once
// every peer has ended the previous epoch (done[r] >= epoch - 1, released by
// each peer's last CTA after its last read), so no peer still reads the old
// one; a peer's done waits on nothing of this epoch, so this wait ends.
KOSMOS_DEVICE void announce_source_at(uint64_t* src_ptr, uint64_t* src_epoch, const uint64_t* done, uint64_t at,
                                      uint64_t epoch, int tp, int rank, uint64_t timeout_ns, const WaitSite& site) {
  wait_peers_done(done, epoch - 1, tp, rank, timeout_ns, site);
  *reinterpret_cast<volatile uint64_t*>(src_ptr) = at;
  store_release<Scope::kSys>(src_epoch, epoch);  // orders the address before it
}

// CTA-wide, once per CTA (`seen` remembers it): no thread of the CTA writes the
// data region before the last writer's readers are done.
KOSMOS_DEVICE void heap_use_guard(bool& seen, char* heap, uint64_t timeout_ns, const WaitSite& site) {
  if (seen) return;
  if (threadIdx.x == 0) heap_use_wait(heap, timeout_ns, site);
  __syncthreads();
  seen = true;
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

// CTA-wide at the end of a CTA's life: true in thread 0 of the launch's last CTA
// only. The barrier orders the CTA's work before thread 0's acq_rel count, so
// the last CTA has acquired every CTA's work.
KOSMOS_DEVICE bool last_cta_done(uint32_t* finished, int grid) {
  __syncthreads();
  return threadIdx.x == 0 && add_acq_rel_gpu_u32(finished, 1) == (uint32_t)grid - 1;
}

// The last CTA of a launch in `epoch`: tells every peer this rank is done reading
// its data region (uint64 done[rank] at heap[r] + done_off, the same offset on
// every rank) and, when there are peers, records this launch as the writer of
// our region whose readers release done[] at done_off.
KOSMOS_DEVICE void release_peers(char* const* heap, size_t done_off, uint64_t epoch, int tp, int rank) {
  for (int r = 0; r < tp; ++r)
    if (r != rank) store_release<Scope::kSys>(reinterpret_cast<uint64_t*>(heap[r] + done_off) + rank, epoch);
  if (tp > 1) heap_use_record(heap[rank], done_off, epoch, tp, rank);
}
#endif

}  // namespace kosmos
