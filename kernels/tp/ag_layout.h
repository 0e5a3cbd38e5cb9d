// Where AG+GEMM keeps its state in each device's symmetric heap. Every rank uses
// the same offsets, so a peer's control block is heap[peer] + the same offset.
// The heap is zeroed once at allocation; after that only kernels write these words.
//
// One control block per group (a slot, agreed by every process at trace time:
// kosmos_jax/runtime.py CtrlSlots): a device that calls ag_tn over several groups
// a different number of times keeps one epoch per group, so peers never drift.
// The data region is shared by all groups; HeapUse records its last writer so
// the next launch, whatever its group, waits until that launch's readers are done.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kosmos/platform.h"

namespace kosmos {

constexpr int kMaxRanks = 8;
// Rows of one tile row in every TP+SP schedule: the movers' unit of rows, the
// flags' and the staging's, and both engines' kBM (their kernels assert it).
constexpr int kTileRows = 128;
constexpr int kMaxTileRows = 4096;  // per shard: 4096 x kTileRows = 512K local rows

struct AgCtrl {
  uint64_t epoch;          // last epoch this device completed (kernel-advanced)
  uint32_t move_next;      // move queue counter (reset by the last CTA)
  uint32_t build_next;     // build queue counter
  uint32_t finished;       // CTAs done this launch
  uint32_t pad_;
  // Where the peers read our shard this epoch (ag_nn and bulk_ag_nn under pull):
  // src_ptr, set before src_epoch is released, is x itself, which every peer of
  // the group (all in this process) reads directly, or 0: our gather slot,
  // tile row t once pub[t] (tp/ag_ops.cuh announce_source).
  uint64_t src_epoch;
  uint64_t src_ptr;
  uint64_t done[kMaxRanks];  // done[p] = last epoch in which peer p finished reading our slot
  uint64_t ready[kMaxRanks];  // ready[p] = last epoch in which peer p's gather region took pushes (Push)
  uint64_t pub[kMaxTileRows];  // pub[t] = epoch our tile row t was published (peers read it)
  uint64_t arrived[kMaxRanks * kMaxTileRows];  // [src][t]: epoch src's row t landed here
};

// The last launch that wrote this device's data region (tp > 1 only), of any op
// (tp/heap_use.cuh): its readers are the group's other ranks, done when the
// uint64 done[r] at heap + done_off is >= epoch (AgCtrl::done or RsCtrl::done).
struct HeapUse {
  uint64_t done_off;  // 0: the data region was never written
  uint64_t epoch;
  uint32_t tp, rank;
};

constexpr int kCtrlSlots = 32;  // distinct groups per job (runtime.py CTRL_SLOTS)
constexpr size_t kHeapUseOffset = 0;
constexpr size_t kCtrlTableOffset = 4096;
constexpr size_t kCtrlStride = (sizeof(AgCtrl) + 4095) / 4096 * 4096;
constexpr size_t kHeapDataOffset = 16u << 20;  // gather slots start here, 16 MiB in
static_assert(sizeof(HeapUse) <= kCtrlTableOffset, "HeapUse must fit below the control table");
static_assert(kCtrlTableOffset + kCtrlSlots * kCtrlStride <= kHeapDataOffset,
              "the control table must fit below the data region");

KOSMOS_HD constexpr size_t ag_ctrl_offset(int slot) { return kCtrlTableOffset + (size_t)slot * kCtrlStride; }

inline size_t ag_slot_bytes(size_t rows, size_t k, size_t elem) {
  return (rows * k * elem + 255) / 256 * 256;  // 256-byte aligned slots
}

}  // namespace kosmos
