// Fused all-gather + GEMM (paper §3.2.1): Y = allgather_rows(X) @ W in one
// persistent launch; the same movers serve the row-parallel dgrad (ag_nn: W
// read transposed, the gathered rows also returned) and, with builders that
// wait for nothing, the bulk gather beside the column-parallel dgrad
// (tp/bulk_ag.cuh). Movers pull peers' tile rows into this rank's gather slots
// and release a per-row flag; builders run the local shard first, then peer
// tiles in the order they are pulled, waiting for each tile's rows in the tile
// engine's before_tile; a mover with no moves left becomes a builder, a builder
// never moves (the one CTA life, tp/ag_sched.h ag_cta). The movers and the
// build claims are tp/ag_ops.cuh; this file has the portable builders (the
// portable tile engine with AgHooks); ag_gemm_sm90.cuh has the Hopper ones,
// which may also push: movers write their own rows into the peers' slots
// (the Push transport; AgDeviceOps::announce_ready, push).
#pragma once
#include <cstddef>
#include <cstdint>

#include "gemm/portable/tile_engine.cuh"
#include "gemm/tile_hooks.h"
#include "kosmos/platform.h"
#include "kosmos/pull.h"
#include "kosmos/sync.h"
#include "kosmos/trace.h"
#include "tp/ag_layout.h"
#include "tp/ag_ops.cuh"
#include "tp/ag_sched.h"

namespace kosmos {

// The portable kernels' shared state: the engine's, and the claims' broadcast cell.
struct AgShared {
  portable::EngineSmem tile;
  int bcast;
};

// The portable builders' hooks (gemm/tile_hooks.h). Engine tile row m = src *
// T + t reads shard src's tile row t (a_source): our own from x, complete
// before the launch, so own tiles wait for nothing; a peer's from the slot our
// movers pull it into. Its rows go to the gathered rows of Y (row_ptr; rows
// past the shard's end are neither read nor stored). By value, as AgSm90Hooks.
template <typename Elem>
struct AgHooks {
  static constexpr bool kTileDone = false, kMapsRows = true, kSplitA = true;
  const Elem* x;            // [rows, K]: our shard
  const char* gather;       // this rank's gather region: shard src's [rows, K] at src * slot_bytes
  size_t slot_bytes;
  Elem* y;                  // [batch, tp * m_local, N]
  const uint64_t* arrived;  // our AgCtrl::arrived, [src][t]
  uint64_t epoch, timeout_ns;
  int rank, tp, T, rows, m_local, N;
  TraceBuf trace;

  // Thread 0, before the tile's first load: a peer tile's rows have landed
  // this epoch. Our movers pulled them and released arrived[] (Pull::kLanded);
  // the engine's barrier after this orders every thread's (generic-proxy)
  // loads behind the acquire. ag_cta argues why the pull is claimed, or will
  // be, by a running mover that waits on nothing a builder does.
  KOSMOS_DEVICE void before_tile(gemm::TileCoord t) {
    const int src = t.m / T, tr = t.m - src * T;
    if (src == rank) return;
    const TraceSpan wait;
    wait_ge<Pull::kLanded>(&arrived[src * kMaxTileRows + tr], epoch, timeout_ns,
                           {"ag_tn", rank, (int)blockIdx.x, "arrived", src * kMaxTileRows + tr});
    wait.close(trace, blockIdx.x, kTraceWait, t.m);
  }
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(gemm::TileCoord) {}
  KOSMOS_DEVICE const Elem* a_source(gemm::TileCoord t, int* a_rows, int* tile_m) const {
    const int src = t.m / T;
    *a_rows = rows;
    *tile_m = t.m - src * T;
    return src == rank ? x : reinterpret_cast<const Elem*>(gather + (size_t)src * slot_bytes);
  }
  template <class OutT>
  KOSMOS_DEVICE OutT* row_ptr(gemm::TileCoord t, int r) const {
    return ag_row_ptr<OutT>(*this, t, r);
  }
};

// The portable kernels' Ops: AG's movers, and builders that run the portable
// engine over the build queue: ag_tn TN over w [K, N], ag_nn NN over w [N, K]
// (dX = AG(dY) @ w.T). Its A has every shard's T tile rows, shard-major.
template <typename T, AgOp kOp>
struct AgOps : AgDeviceOps<T, AgShared, Pull, kOp> {
  using Engine = portable::TileEngine<kOp == AgOp::kNn ? gemm::Layout::NN : gemm::Layout::TN, T, T>;
  static_assert(Engine::kBM == kTileRows && Engine::kBN == portable::kBN, "AgShape's tiles are the engine's");

  KOSMOS_DEVICE void build_all() {
    const TraceSpan span;
    const AgParams<T>& a = this->p;
    AgSched sched{this->ctrl, a.shape};
    AgHooks<T> hooks{a.x, a.heap[a.rank] + kHeapDataOffset, a.slot_bytes, a.y, this->ctrl->arrived, this->epoch,
                     a.timeout_ns, a.rank, a.tp, a.shape.T, a.rows, a.m_local, a.N, a.trace};
    const gemm::Problem prob{a.x, a.w, a.y, a.tp * a.shape.T * Engine::kBM, a.N, a.K};
    Engine::run(prob, this->sm.tile, sched, hooks);
    if (threadIdx.x == 0) span.close(a.trace, blockIdx.x, kTraceBuild);
  }
};

template <typename T, AgOp kOp>
KOSMOS_DEVICE void ag_portable_cta(const AgParams<T>& p, AgShared& sm) {
  AgCtrl* ctrl = reinterpret_cast<AgCtrl*>(p.heap[p.rank] + p.ctrl_off);
  const uint64_t epoch = launch_epoch(&ctrl->epoch);
  AgOps<T, kOp> ops{{p, sm, ctrl, epoch, false}};
  ag_cta<Pull>(ops, p.shape, (int)blockIdx.x, (int)gridDim.x, p.movers, p.switching != 0);
}

// Dynamic shared memory is only padding: it makes two CTAs never fit on one SM.
// ag_tn: Y = AG(x) @ w; ag_nn: dX = AG(dY) @ w.T, AG(dY) also written to g_out.
template <typename T>
__global__ void __launch_bounds__(portable::kThreads, 1) ag_tn_kernel(const AgParams<T> p) {
  __shared__ AgShared sm;
  ag_portable_cta<T, AgOp::kTn>(p, sm);
}
template <typename T>
__global__ void __launch_bounds__(portable::kThreads, 1) ag_nn_kernel(const AgParams<T> p) {
  __shared__ AgShared sm;
  ag_portable_cta<T, AgOp::kNn>(p, sm);
}

}  // namespace kosmos
