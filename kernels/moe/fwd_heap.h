// Where the MoE forward keeps, at EP > 1, what peers write: each rank's
// symmetric heap (the TP+SP ops' heap, tp/ag_layout.h), at the same offsets on
// every rank, so a peer's block is heap[peer] + the same offset.
//
//   control table   one MoeCtrl (moe/fwd_ctl.cuh) per group slot, below the
//                   data region, after the TP+SP ops' tables: peers store into
//                   it (ready, counts, the count table, arrived, returned) from
//                   the first instruction of their launch, so it must never
//                   overlap what another op's launch may still be reading.
//                   Zeroed once with the heap; flags hold epochs, counters are
//                   re-armed by the launches (moe/fwd_sched.h).
//   arena           [R][H] bf16 at the data region: the experts' input rows,
//                   pushed by every source (moe_rank_rows rows: never overflows)
//   returned rows   [P][H] bf16 after it: our pairs' expert outputs, pushed
//                   back by their owners in our packed send order
//   X arena         [R][H] bf16 after them, the backward's only: the forward's
//                   input rows of our experts' pairs, for wgrad1 (moe/fwd_sched.h)
//
// The data region is shared with the TP+SP ops: a launch's CTA 0 waits on
// HeapUse (tp/heap_use.cuh: the last TP+SP writer's readers are done) before
// it announces itself ready, and no peer writes into it before that
// announcement. Only this rank reads what lands there, within the launch, so
// the launch leaves HeapUse as it found it.
#pragma once
#include <cstddef>

#include "moe/fwd_ws.h"
#include "tp/ag_layout.h"
#include "tp/rs_layout.h"

namespace kosmos::moe {

constexpr size_t kMoeCtrlTableOffset = kRsCtrlTableOffset + (size_t)kCtrlSlots * kRsCtrlStride;
constexpr size_t kMoeCtrlStride = 49152;  // sizeof(MoeCtrl) in whole 4 KiB pages (fwd_ctl.cuh checks it)
static_assert(kMoeCtrlTableOffset + (size_t)kCtrlSlots * kMoeCtrlStride <= kHeapDataOffset,
              "the MoE control table must fit below the data region");

KOSMOS_HD constexpr size_t moe_ctrl_offset(int slot) { return kMoeCtrlTableOffset + (size_t)slot * kMoeCtrlStride; }

struct MoeHeap {
  size_t arena, ret, xrows, end;  // byte offsets in the heap; end: the heap bytes the call needs
};

// xrows: the backward's layout, whose X arena [R][H] follows the returned rows
// (its arena holds the dY rows, its returned rows the dX rows).
KOSMOS_HD inline MoeHeap moe_heap_layout(int t, int k, int ep, int e_local, int H, bool xrows = false) {
  const size_t R = (size_t)moe_rank_rows(t, k, ep, e_local), P = (size_t)moe_return_rows(t, k, ep, ep * e_local);
  MoeHeap h{};
  h.arena = kHeapDataOffset;
  h.ret = h.arena + moe_ws_align(R * H * 2);
  h.xrows = h.ret + moe_ws_align(P * H * 2);
  h.end = h.xrows + (xrows ? moe_ws_align(R * H * 2) : 0);
  return h;
}

}  // namespace kosmos::moe
