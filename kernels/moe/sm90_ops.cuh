// What the Hopper MoE megakernels' Ops (MoeSm90Ops, moe/fwd_sm90.cuh;
// MoeBwdSm90Ops, moe/bwd_sm90.cuh) share over MoeLocalOps: the steps whose
// EP = 1 instantiation holds no peer code.
#pragma once
#include "moe/fwd_ops.cuh"

namespace kosmos::moe {

// kPeers: the instantiation launched at EP > 1; the EP = 1 one holds no peer
// code (MoeLocalOps, kPeers).
template <bool kPeers>
struct MoeSm90LocalOps : MoeLocalOps {
  KOSMOS_DEVICE void build_layout() { MoeLocalOps::build_layout<kPeers>(); }
  KOSMOS_DEVICE void fold(int item, int first, int last) {
    MoeLocalOps::fold<kPeers, kMoeFoldStagesSm90>(item, first, last);
  }
  KOSMOS_DEVICE void push_unit(const MoeUnit& c) {
    if constexpr (kPeers) MoeLocalOps::push_unit(c);
    else trap();  // units go to peers only (moe_push_unit), and this kernel runs at EP = 1
  }
};

}  // namespace kosmos::moe
