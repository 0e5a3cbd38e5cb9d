// What the Hopper MoE megakernels' Ops (MoeSm90Ops, moe/fwd_sm90.cuh;
// MoeBwdSm90Ops, moe/bwd_sm90.cuh) share over MoeLocalOps: the steps whose
// EP = 1 instantiation holds no peer code.
#pragma once
#include <cstddef>
#include <type_traits>

#include "gemm/sm90/tile_config.cuh"
#include "moe/fwd_ops.cuh"

namespace kosmos::moe {

// Where two engines of a megakernel (First's passes, then Then's: a build
// queue that puts every tile of the first kinds before any of the second's)
// share the dynamic shared memory, with First's A and B rings the front's
// scratch before and the fold's after. Then's storage must end before
// First's barriers, which stay live from pass to pass, and Then's barriers,
// written over First's staged buffer once First is done, must lie past the
// rings the fold uses: so no barrier's memory is ever another's data (PTX
// leaves an mbarrier's memory to mbarrier operations until mbarrier.inval).
template <class First, class Then>
constexpr bool moe_storages_fit() {
  using S1 = sm90::SharedStorage<First>;
  using S2 = sm90::SharedStorage<Then>;
  if constexpr (std::is_same_v<First, Then>) {
    return true;
  } else {
    return Then::kThreads == First::kThreads && Then::kBM == First::kBM && sizeof(S2) <= offsetof(S1, full) &&
           offsetof(S2, full) >= offsetof(S1, c);
  }
}
// The launch's dynamic shared memory for both.
template <class First, class Then>
constexpr size_t kMoeSmemBytes = sm90::SharedStorage<First>::kLaunchBytes > sm90::SharedStorage<Then>::kLaunchBytes
                                     ? sm90::SharedStorage<First>::kLaunchBytes
                                     : sm90::SharedStorage<Then>::kLaunchBytes;

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
