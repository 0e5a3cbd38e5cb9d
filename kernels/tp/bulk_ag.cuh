// Fused bulk all-gather || NN GEMM (paper §3.2, Figure 5: the column-parallel
// backward). Two independent results in one persistent launch:
//   xg  = all_gather_rows(x)   [batch, tp * m_local, k], for the weight gradient
//   dxp = dy @ w.T             [M, k], this rank's partial of dX (no gathered row needed)
// Movers run AG+GEMM's moves (tp/ag_gemm.cuh: publish own rows into this
// rank's heap slot and into xg, or only into xg where the peers read x itself
// (AgParams::direct), then pull peers' rows straight into xg, since no builder
// reads the slots: AgOp::kBulk); builders run a tile engine over
// dxp's tiles, which wait for nothing; a mover whose queue is empty builds.
// The CTA life is AG+GEMM's ag_cta (tp/ag_sched.h): with at least one mover
// per rank (tp > 1) every pull is claimed by a CTA that waits only on the
// peer's publishes, which its movers claim first, and builders never wait, so
// no CTA waits on work no running mover does, whatever the grid.
#pragma once
#include "gemm/portable/tile_engine.cuh"
#include "gemm/tile_order.h"
#include "tp/ag_gemm.cuh"
#include "tp/queue_sched.h"

namespace kosmos {

template <typename T>
struct BulkAgParams {
  AgParams<T> ag;  // the gather: x [rows, k] -> ag.g_out; ag.w and ag.y unused; ag.shape.NT unused
  const T* dy;     // [M, n], M = batch * tp * m_local (the full sequence)
  const T* w;      // [k, n]
  T* dx;           // [M, k] = dy @ w.T
  int M, n, k;
  int group;       // build order: bands of `group` tile rows walked column by column (<= 1: row-major)
};

// dxp's tiles in build-queue order: bands of `group` tile rows walked column
// by column (<= 1: row-major); the bands let co-running builders share a few
// dy rows and a few w rows in L2.
struct BulkAgOrder {
  int tiles_m, tiles_n, group;
  KOSMOS_HD int count() const { return tiles_m * tiles_n; }
  KOSMOS_HD gemm::TileCoord at(int j) const {
    if (group <= 1) return {j / tiles_n, j % tiles_n};
    return gemm::SwizzledOrder{tiles_m, tiles_n, group}.at(j);
  }
};

// Claims of dxp's tiles from the AG control block's build queue (reset by the
// launch's last CTA, as for AG+GEMM).
using BulkAgSched = QueueSched<AgCtrl, BulkAgOrder>;

// The portable builders: the SIMT engine over the plain problem dxp [M, k] =
// dy [M, n] @ w [k, n].T (NN: both operands K-major), with hooks that wait for
// nothing: no row a tile reads is moved.
template <typename T>
struct BulkAgOps : AgDeviceOps<T, AgShared, Pull, AgOp::kBulk> {
  using Engine = portable::TileEngine<gemm::Layout::NN, T, T>;
  const BulkAgParams<T>& q;

  KOSMOS_DEVICE void build_all() {
    const TraceSpan span;
    BulkAgSched sched{this->ctrl, gemm::ceil_div(q.M, Engine::kBM), gemm::ceil_div(q.k, Engine::kBN), q.group};
    gemm::NoHooks hooks;
    Engine::run(gemm::Problem{q.dy, q.w, q.dx, q.M, q.k, q.n}, this->sm.tile, sched, hooks);
    if (threadIdx.x == 0) span.close(this->p.trace, blockIdx.x, kTraceBuild);
  }
};

template <typename T>
__global__ void __launch_bounds__(portable::kThreads, 1) bulk_ag_nn_kernel(const BulkAgParams<T> q) {
  __shared__ AgShared sm;
  AgCtrl* ctrl = reinterpret_cast<AgCtrl*>(q.ag.heap[q.ag.rank] + q.ag.ctrl_off);
  const uint64_t epoch = launch_epoch(&ctrl->epoch);
  BulkAgOps<T> ops{{q.ag, sm, ctrl, epoch, false}, q};
  ag_cta<Pull>(ops, q.ag.shape, (int)blockIdx.x, (int)gridDim.x, q.ag.movers, q.ag.switching != 0);
}

}  // namespace kosmos
