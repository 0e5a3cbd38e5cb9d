// The MoE backward's workspace (moe/bwd_sm90.cuh): one byte buffer
// (the FFI's `ws` result) cut into sections of whole KiB, as the forward's
// (moe/fwd_ws.h). kosmos_jax/ops/_fused_moe_bwd.py computes the same total.
//
//   ctrl      kMoeCtrlBytes  MoeCtrl at EP = 1: zeroed before each launch (at EP > 1 in the heap)
//   rb        32 per row block of R + S: dgrad2 / dgrad1 flags and counts, zeroed with ctrl
//   hist      [nb][E] int
//   order     [R] int
//   arena     [R][H] bf16    the pairs' dY rows (output gating: w * dY), padding rows zeroed;
//                            EP = 1 only (at EP > 1 peers push them: the heap, moe/fwd_heap.h)
//   dh1       [R + S][2I] bf16  d(gate | up), dgrad2's (the shared expert's in the last S rows)
//
// (dgrad1's dX rows and the pairs' rows are results of the launch.)
// The forward's workspace (its residual) holds what the backward reads of the
// forward: act and h1 and, at EP = 1, the gathered x rows, in the same arena
// rows (the backward's front recomputes the forward's plan from the same
// routing). At EP > 1 the x rows are pushed again (moe/fwd_sched.h).
// R = moe_rank_rows (moe/fwd_ws.h).
#pragma once
#include <cstddef>

#include "moe/fwd_ws.h"

namespace kosmos::moe {

struct MoeBwdWs : MoeWsHead {
  size_t dh1, total;  // byte offsets, and the whole
  size_t zeroed;      // bytes from 0 the launcher clears
};

KOSMOS_HD inline MoeBwdWs moe_bwd_ws_layout(int t, int k, int ep, int e_local, int H, int I, bool shared) {
  const size_t R = (size_t)moe_rank_rows(t, k, ep, e_local), S = (size_t)moe_shared_rows(t, shared);
  MoeBwdWs w{};
  static_cast<MoeWsHead&>(w) = moe_ws_head(t, k, ep, e_local, H, shared);
  w.dh1 = w.end;
  w.total = w.dh1 + moe_ws_align((R + S) * 2 * I * 2);
  w.zeroed = w.hist;
  return w;
}

}  // namespace kosmos::moe
