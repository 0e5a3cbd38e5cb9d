// What the Hopper MoE megakernels' Ops (MoeSm90Ops, moe/fwd_sm90.cuh;
// MoeBwdSm90Ops, moe/bwd_sm90.cuh) share over MoeLocalOps: the steps whose
// EP = 1 instantiation holds no peer code.
#pragma once
#include "moe/dispatch_sm90.cuh"
#include "moe/fwd_ops.cuh"

namespace kosmos::moe {

// kPeers: the instantiation launched at EP > 1; the EP = 1 one holds no peer
// code (MoeLocalOps, kPeers).
template <bool kPeers>
struct MoeSm90LocalOps : MoeLocalOps {
  MoeLayout* lcopy;           // static shared memory of the kernel
  MoeDispatchRing* dispatch;  // and a ring's state per warp (moe_dispatch_rings_init)

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
  // Dispatch part m by bulk copies (moe/dispatch_sm90.cuh), a warp per row
  // as MoeLocalOps::push_part: each warp looks up its next 32 rows' pairs in
  // one load, then streams their chunks through its ring.
  KOSMOS_DEVICE void push_part(const MoeMove& m) {
    const TraceSpan span;
    const PartRows rs = this->part_rows(m);
    const int k = this->s().top_k, H = this->p().H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, W = blockDim.x / 32;
    MoeBulkDispatch bulk(dispatch + warp, reinterpret_cast<char*>(this->scratch) + warp * kDispatchRingBytes);
    for (int r0 = rs.begin + warp; r0 < rs.end; r0 += 32 * W) {
      const int r = r0 + lane * W, n = min(32, (rs.end - r0 + W - 1) / W);
      const int q = r < rs.end ? rs.order[r] : 0;
      const float w = r < rs.end && rs.gated ? this->p().weights[q] : 1.f;
      for (int i = 0; i < n; ++i) {
        const int qi = __shfl_sync(~0u, q, i);
        const float wi = __shfl_sync(~0u, w, i);
        bulk.push(rs.x + (size_t)(qi / k) * H, rs.arena + (size_t)(rs.at + r0 + i * W) * H, H, wi, lane, rs.gated);
      }
    }
    bulk.drain(lane, rs.gated);
    this->zero_padding(m, rs);
    this->close_part(m, span);
  }
  KOSMOS_DEVICE void push_unit(const MoeUnit& c) {
    if constexpr (kPeers) MoeLocalOps::push_unit(c);
    else trap();  // units go to peers only (moe_push_unit), and this kernel runs at EP = 1
  }
};

}  // namespace kosmos::moe
