// Fused bulk reduce-scatter || NT GEMM with Hopper builders (sm_90a): the
// movers, reducers, flags and epochs of tp/bulk_rs.cuh, and builders that are
// the TMA + WGMMA tile engine over the plain problem dw [k, n] = xg [M, k]^T @
// dy [M, n] (gemm::Layout::NT: A = xg and B = dy, both MN-major; the engine
// contracts over the M rows). Nothing a tile reads is produced in the launch,
// so the engine runs with hooks that wait for nothing (gemm::NoHooks) and
// stores dw through its own TMA descriptor.
//
// Only the engine's claimer thread claims tiles, so pushes and reductions,
// which are CTA-wide, run outside TileEngine::run (tp/bulk_rs_sched.h
// bulk_rs_cta): a mover pushes before it enters the engine, and every CTA
// drains pushes and reduces after it returns (the engine returns with every
// warp at the kernel's even register share).
#pragma once
#include "gemm/sm90/tile_engine.cuh"
#include "tp/bulk_rs.cuh"

namespace kosmos {

template <class Cfg>
struct BulkRsSm90Params {
  BulkRsParams<bf16_t> rs;  // shape.tiles_m/n in units of Cfg's tile
  sm90::Params<Cfg> g;      // TMA over xg (A), dy (B) and dw (C)
};

struct BulkRsSm90Shared {
  uint64_t src[kMaxRanks];  // a reduce's peers' dx_partial addresses (0: staged), thread 0's
  int bcast;
  static KOSMOS_DEVICE const char* kernel() { return "bulk_rs_nt_sm90"; }
};

// Reducers keep 4 loads of a term in flight per thread, not 8: after the engine
// the kernel has 168 registers a thread, and 8 spilled ~110 bytes (ptxas).
template <class Cfg>
struct BulkRsSm90Ops : BulkRsDeviceOps<bf16_t, BulkRsSm90Shared, 4> {
  const BulkRsSm90Params<Cfg>& pp;
  sm90::SharedStorage<Cfg>& s;

  KOSMOS_DEVICE void build_all() {
    const TraceSpan span;
    BulkRsGemmSched sched{this->ctrl, this->p.shape};
    gemm::NoHooks hooks;
    sm90::TileEngine<Cfg, gemm::bf16, gemm::NoHooks>::run(pp.g, s, sched, hooks);
    __syncthreads();  // the engine's warp groups leave at different times; the CTA-wide roles follow
    if (threadIdx.x == 0) span.close(this->p.trace, blockIdx.x, kTraceBuild);
  }
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bulk_rs_nt_sm90_kernel(const __grid_constant__ BulkRsSm90Params<Cfg> p) {
  extern __shared__ char smem_raw[];
  __shared__ BulkRsSm90Shared sm;
  auto& s = sm90::shared_storage<Cfg>(smem_raw);
  RsCtrl* ctrl = reinterpret_cast<RsCtrl*>(p.rs.heap[p.rs.rank] + p.rs.ctrl_off);
  const uint64_t epoch = launch_epoch(&ctrl->epoch);
  BulkRsSm90Ops<Cfg> ops{{p.rs, sm, ctrl, epoch}, p, s};
  bulk_rs_cta(ops, p.rs.shape, (int)blockIdx.x, (int)gridDim.x, p.rs.movers, p.rs.switching != 0);
}

}  // namespace kosmos
