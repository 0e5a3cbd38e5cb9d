// Fused bulk all-gather || NN GEMM with Hopper builders (sm_90a): the movers of
// tp/bulk_ag.cuh, and builders that are the TMA + WGMMA tile engine over the
// plain problem dxp [M, k] = dy [M, n] @ w [k, n].T (gemm::Layout::NN: both
// operands K-major). Nothing a tile reads is moved, so the engine runs with
// hooks that wait for nothing and stores through its own TMA descriptor.
#pragma once
#include "gemm/sm90/tile_engine.cuh"
#include "tp/ag_gemm_sm90.cuh"
#include "tp/bulk_ag.cuh"

namespace kosmos {

template <class Cfg>
struct BulkAgSm90Params {
  BulkAgParams<bf16_t> b;  // movers' AgParams, the GEMM's shape and build order
  sm90::Params<Cfg> g;     // TMA over dy (A), w (B) and dxp (C)
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bulk_ag_nn_sm90_kernel(const __grid_constant__ BulkAgSm90Params<Cfg> p) {
  extern __shared__ char smem_raw[];
  __shared__ AgSm90Shared sm;
  auto& s = sm90::shared_storage<Cfg>(smem_raw);
  const AgParams<bf16_t>& ag = p.b.ag;
  AgCtrl* ctrl = reinterpret_cast<AgCtrl*>(ag.heap[ag.rank] + ag.ctrl_off);
  const uint64_t epoch = launch_epoch(&ctrl->epoch);
  struct Ops : AgDeviceOps<bf16_t, AgSm90Shared, Pull, AgOp::kBulk> {
    const BulkAgSm90Params<Cfg>& pp;
    sm90::SharedStorage<Cfg>& s;
    KOSMOS_DEVICE void build_all() {
      const TraceSpan span;
      BulkAgSched sched{this->ctrl, gemm::ceil_div(pp.b.M, Cfg::kBM), gemm::ceil_div(pp.b.k, Cfg::kBN), pp.b.group};
      gemm::NoHooks hooks;
      sm90::TileEngine<Cfg, gemm::bf16, gemm::NoHooks>::run(pp.g, s, sched, hooks);
      if (threadIdx.x == 0) span.close(this->p.trace, blockIdx.x, kTraceBuild);
    }
  } ops{{ag, sm, ctrl, epoch, false}, p, s};
  ag_cta<Pull>(ops, ag.shape, (int)blockIdx.x, (int)gridDim.x, ag.movers, ag.switching != 0);
}

}  // namespace kosmos
