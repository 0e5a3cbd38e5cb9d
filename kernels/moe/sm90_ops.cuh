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
  MoeLayout* lcopy;  // static shared memory of the kernel

  // The layout in shared memory: the tile engine's claimer finds each tile's
  // expert by a binary search over L.rb, and the loading thread again (its B's
  // first k-block); over global memory that is ~8 dependent round trips to L2
  // a search, as every flag's acquire drops the SM's L1 (CCTL.IVALL, sm_90a
  // SASS), on the path between one tile's loads and the next one's.
  KOSMOS_DEVICE const MoeLayout& local_layout() {
    const int* from = reinterpret_cast<const int*>(&layout());
    int* to = reinterpret_cast<int*>(lcopy);
    for (int i = threadIdx.x; i < (int)(sizeof(MoeLayout) / sizeof(int)); i += blockDim.x) to[i] = from[i];
    __syncthreads();
    return *lcopy;
  }
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
