// The EP group's MoE blocks in its ranks' symmetric heaps (kernels/moe/fwd_heap.h),
// for the launch parameters of the forward (moe_fwd_cuda.cu) and the backward
// (moe_bwd_cuda.cu): every rank's control block, receive arena, returned rows
// and, for the backward, X arena, at the same offsets in each rank's heap.
#pragma once
#include "launch.h"
#include "moe/fwd_ctl.cuh"

namespace kosmos {

inline void moe_heap_peers(moe::MoeFwdParams* m, const GroupInfo& g, int ctrl_slot, const moe::MoeHeap& h, int ep,
                           bool xrows) {
  for (int r = 0; r < ep; ++r) {
    m->peer_ctrl[r] = reinterpret_cast<moe::MoeCtrl*>(g.heaps[r] + moe::moe_ctrl_offset(ctrl_slot));
    m->peer_arena[r] = reinterpret_cast<bf16_t*>(g.heaps[r] + h.arena);
    m->peer_ret[r] = reinterpret_cast<bf16_t*>(g.heaps[r] + h.ret);
    m->peer_xrows[r] = xrows ? reinterpret_cast<bf16_t*>(g.heaps[r] + h.xrows) : nullptr;
  }
  m->ctrl = m->peer_ctrl[g.rank];
  m->arena = m->peer_arena[g.rank];
  m->heap = g.heaps[g.rank];
}

// "" when the heap holds what the call needs (h.end bytes), else the MiB it needs.
inline std::string moe_heap_refusal(const moe::MoeHeap& h, const GroupInfo& g, int64_t t, int64_t k, int64_t ep) {
  if (h.end <= g.heap_bytes) return "";
  return "t=" + std::to_string(t) + " tokens x top_k=" + std::to_string(k) + " at ep=" + std::to_string(ep) +
         " need " + std::to_string((h.end + (1u << 20) - 1) >> 20) + " MiB of symmetric heap (have " +
         std::to_string(g.heap_bytes >> 20) +
         " MiB; set KOSMOS_HEAP_MB or kosmos_jax.runtime.init(heap_mb=...) before the first kosmos op)";
}

}  // namespace kosmos
