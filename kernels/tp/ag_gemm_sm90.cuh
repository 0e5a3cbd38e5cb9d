// Fused all-gather + GEMM with Hopper builders (sm_90a): the queues, flags,
// movers and epochs of ag_gemm.cuh, with builders that are the TMA + WGMMA tile
// engine (gemm/sm90/tile_engine.cuh). The CTA life is ag_cta (tp/ag_sched.h):
// the engine's claimer thread claims build items (AgSched) and waits for
// their rows; builders never move and the launcher always starts at least one
// mover when there are peers.
//
// A is this rank's gather region read as one [tp * T * kBM, K] matrix: shard s
// occupies rows [s * T * kBM, (s + 1) * T * kBM). Pull: its own rows included
// (movers publish them there, which is also what peers pull). Push: the peers
// write their rows there themselves and the own shard's tiles read x directly
// through a second TMA descriptor (AgSm90Params::own, the engine's a_source
// hook), so no builder waits for a publish and nothing is published. ag_nn
// (an NN Cfg: dX = AG(dY) @ w.T, the gathered dY returned) pulls, and its own
// tiles read dY through that descriptor too while the movers publish, and its
// peer tiles read the gathered output the movers write anyway (AgSm90Params::out,
// when AgParams::pull_to_out_only), so a pulled row is stored once. Rows past
// a shard's end are never written and never stored (row_ptr masks them). With
// tp == 1 there are no slots and A is x itself.
#pragma once
#include "gemm/sm90/tile_engine.cuh"
#include "kosmos/pull.h"
#include "kosmos/push.h"
#include "kosmos/types.h"
#include "tp/ag_ops.cuh"

namespace kosmos {

template <class Cfg>
struct AgSm90Params {
  AgParams<bf16_t> ag;   // x, w, y, heaps, shape (NT in units of Cfg::kBN), movers >= 1 if tp > 1
  sm90::Params<Cfg> g;   // TMA over A (see above) and W [K, N]; g.M = tp * T * kBM
  typename sm90::Params<Cfg>::TmaA own;  // push, ag_nn: TMA over x [rows, K], the own shard's A
  typename sm90::Params<Cfg>::TmaA out;  // ag_nn with pull_to_out_only: TMA over g_out [batch * tp * m_local, K]
};

struct AgSm90Shared {
  int bcast;
};

// By value, not a pointer into the kernel parameters: the epilogue stores through
// row_ptr, and a pointer the compiler must assume those stores may alias would
// reload every field (and redo the divisions) per stored element pair.
// Tr: the transport (kosmos/pull.h, kosmos/push.h), the kernel's: where peer
// rows land and how a builder waits for them.
// kOwnFromX: the own shard's tiles read x itself (a_source), so no builder
// waits for its own rows: push, where nothing is published, and ag_nn, whose
// pull movers still publish (for the peers and the gathered output) while the
// own tiles build. (Under ag_tn's pull the own tiles wait for the publish.)
template <class Cfg, class Tr, bool kOwnFromX = Tr::kPush>
struct AgSm90Hooks {
  static constexpr bool kTileDone = false, kMapsRows = true, kSplitA = kOwnFromX;
  using TmaA = typename sm90::Params<Cfg>::TmaA;
  const TmaA* own;  // in the kernel parameters (TMA reads descriptors from parameter space)
  const TmaA* out;  // nullptr: peer tiles read the gather region
  AgCtrl* ctrl;
  bf16_t* y;
  uint64_t epoch, timeout_ns;
  int rank, tp, T, rows, m_local, N;
  TraceBuf trace;

  // Producer thread, before the tile's first TMA load: its rows must have been
  // published (own shard), pulled or pushed by the peer (peer shard) in this
  // epoch, generic-proxy stores the transport's wait acquires and fences to the
  // async proxy (push: at system scope, the rows' writer and its release are on
  // the peer; pull: the puller and the publisher's release are ours).
  KOSMOS_DEVICE void before_tile(gemm::TileCoord t) {
    if (tp == 1) return;
    const int src = t.m / T, tr = t.m % T;
    const bool own = src == rank;
    if (kOwnFromX && own) return;  // x, complete before the launch (stream order)
    const uint64_t* flag = own ? &ctrl->pub[tr] : &ctrl->arrived[src * kMaxTileRows + tr];
    const TraceSpan wait;
    Tr::wait_landed_for_tma(
        flag, epoch, timeout_ns, {"ag_tn_sm90", rank, (int)blockIdx.x, own ? "pub" : "arrived", src * kMaxTileRows + tr});
    wait.close(trace, blockIdx.x, kTraceWait, t.m);  // tile: the engine tile row; the producer is thread 0
  }
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(gemm::TileCoord) {}
  // An own-shard tile reads x [rows, K] at its tile row within the shard; with
  // `out`, a peer tile reads g_out at the tile row its rows were pulled to
  // (whole tile rows there: m_local % kBM == 0).
  KOSMOS_DEVICE const TmaA* a_source(gemm::TileCoord t, int* a_rows, int* tile_m) const {
    if (!kOwnFromX || tp == 1) return nullptr;
    const int src = t.m / T, tr = t.m - src * T;
    if (src == rank) {
      *a_rows = rows;
      *tile_m = tr;
      return own;
    }
    if (out == nullptr) return nullptr;
    const int lr = tr * kTileRows, b = lr / m_local;
    *a_rows = rows * tp;
    *tile_m = (((b * tp + src) * m_local) + lr - b * m_local) / kTileRows;
    return out;
  }

  template <class OutT>
  KOSMOS_DEVICE OutT* row_ptr(gemm::TileCoord t, int r) const {
    return ag_row_ptr<OutT>(*this, t, r);
  }
};

template <class Cfg, class Tr>
__global__ void __launch_bounds__(Cfg::kThreads, 1) ag_tn_sm90_kernel(const __grid_constant__ AgSm90Params<Cfg> p) {
  static_assert(Cfg::kBM == kTileRows, "moves and builds share the 128-row tile row");
  extern __shared__ char smem_raw[];
  __shared__ AgSm90Shared sm;
  auto& s = sm90::shared_storage<Cfg>(smem_raw);
  AgCtrl* ctrl = reinterpret_cast<AgCtrl*>(p.ag.heap[p.ag.rank] + p.ag.ctrl_off);
  const uint64_t epoch = launch_epoch(&ctrl->epoch);
  // An NN engine is ag_nn's (dX = AG(dY) @ w.T): its movers also return the gathered rows.
  constexpr AgOp kOp = Cfg::kLayout == gemm::Layout::NN ? AgOp::kNn : AgOp::kTn;
  struct Ops : AgDeviceOps<bf16_t, AgSm90Shared, Tr, kOp> {
    const AgSm90Params<Cfg>& pp;
    sm90::SharedStorage<Cfg>& s;
    KOSMOS_DEVICE void build_all() {
      const TraceSpan span;
      AgSched sched{this->ctrl, this->p.shape};
      const AgParams<bf16_t>& a = this->p;
      using Hooks = AgSm90Hooks<Cfg, Tr, Tr::kPush || kOp == AgOp::kNn>;
      Hooks hooks{&pp.own, a.pull_to_out_only ? &pp.out : nullptr, this->ctrl, a.y, this->epoch, a.timeout_ns, a.rank, a.tp,
                  a.shape.T, a.rows, a.m_local, a.N, a.trace};
      sm90::TileEngine<Cfg, gemm::bf16, Hooks>::run(pp.g, s, sched, hooks);
      if (threadIdx.x == 0) span.close(a.trace, blockIdx.x, kTraceBuild);
    }
  } ops{{p.ag, sm, ctrl, epoch, false}, p, s};
  ag_cta<Tr>(ops, p.ag.shape, (int)blockIdx.x, (int)gridDim.x, p.ag.movers, p.ag.switching != 0);
}

}  // namespace kosmos
