// Fused GEMM + reduce-scatter (paper §3.2.2): Y = reduce_scatter_rows(X @ W) in
// one persistent launch, one-shot pull. Builders compute fp32 partial tiles of
// X @ W into this rank's staging buffer in band-major order and publish each
// completed band; reducers pull band b of our own chunk from every rank, sum the
// ranks in fixed order in fp32 and round once into Y. The schedule is
// tp/rs_sched.h (rs_cta), its device operations tp/rs_ops.cuh; this file has
// the portable builders: the portable tile engine over RsSched with RsHooks.
// The Hopper builders (gemm_rs_sm90.cuh) may also push: builders write partials
// into their owner's staging; the portable kernel pulls only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "gemm/portable/tile_engine.cuh"
#include "gemm/tile_hooks.h"
#include "kosmos/platform.h"
#include "kosmos/pull.h"
#include "tp/rs_ops.cuh"

namespace kosmos {

struct RsShared {
  portable::EngineSmem tile;
  int bcast;
  static KOSMOS_DEVICE const char* kernel() { return "tn_rs"; }
};

// The portable builders' hooks (gemm/tile_hooks.h), pull. Tile t of engine tile
// row m = c * T + tr reads chunk c's tile row tr of x (a_source: a chunk's rows
// need not be a multiple of kBM, so no tile straddles two chunks), leaves as an
// fp32 partial in our staging slot of it (row_ptr) and is counted into its
// band once stored (tile_done). By value, as RsSm90Hooks.
template <typename T>
struct RsHooks {
  static constexpr bool kTileDone = true, kMapsRows = true, kSplitA = true;
  const T* x;    // [tp * rows, K]: chunk c is rows [c * rows, (c + 1) * rows)
  float* stage;  // our staging: heap + kHeapDataOffset
  RsCtrl* ctrl;  // ours
  uint64_t epoch;
  RsShape s;
  int rows, K, tile_n;

  // Pull: nothing of this epoch to wait for (the staging guard precedes the engine).
  KOSMOS_DEVICE void before_tile(gemm::TileCoord) {}
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE const T* a_source(gemm::TileCoord t, int* a_rows, int* tile_m) const {
    const int chunk = t.m / s.T;
    *a_rows = rows;
    *tile_m = t.m - chunk * s.T;
    return x + (size_t)chunk * rows * K;
  }
  // Tile t's staging slot (rs_stage_slot, pull: ours, at the chunk's position).
  KOSMOS_DEVICE float* tile_of(gemm::TileCoord t) const {
    const int chunk = t.m / s.T, tr = t.m - chunk * s.T, band = tr / s.R;
    const int slot = rs_stage_slot(s, band, chunk, rs_band_index(s, tr - band * s.R, t.n));
    return stage + (size_t)slot * rs_tile_elems(tile_n);
  }
  // Engine row r of tile t is row r - t.m * kBM of its slot, element (r, c) at
  // [c] (c counts the engine's columns, so the row pointer is offset back by t.n tiles).
  template <class OutT>
  KOSMOS_DEVICE OutT* row_ptr(gemm::TileCoord t, int r) const {
    static_assert(std::is_same_v<OutT, float>, "partials are staged in fp32");
    const int in_tile = r - t.m * kTileRows;
    if ((t.m % s.T) * kTileRows + in_tile >= rows) return nullptr;  // past the chunk: never read
    return tile_of(t) + (ptrdiff_t)(in_tile - t.n) * tile_n;
  }
  // Thread 0, after the engine's barrier over every thread's stores of the
  // tile: the acq_rel count makes the band's completer acquire every tile of
  // it, so its system-scope release of pub[] covers the whole band for the
  // peers' reducers.
  KOSMOS_DEVICE void tile_done(gemm::TileCoord t) {
    const int chunk = t.m / s.T, band = (t.m - chunk * s.T) / s.R;
    if (add_acq_rel_gpu_u32(&ctrl->band_count[rs_flag_index(band, chunk)], 1) + 1 != (uint32_t)rs_band_tiles(s, band))
      return;
    store_release<Scope::kSys>(&ctrl->pub[rs_flag_index(band, chunk)], epoch);
  }
};

// The portable kernel's Ops, pull only (the handler refuses push here): the
// engine (TN, fp32 out) over x [tp * rows, K] read chunk by chunk, and
// RsDeviceOps' reducers.
template <typename T>
struct RsOps : RsDeviceOps<T, Pull, RsShared> {
  using Engine = portable::TileEngine<gemm::Layout::TN, float, T>;
  static_assert(Engine::kBM == kTileRows && Engine::kBN == portable::kBN, "RsShape's tiles are the engine's");

  // The staging guard is taken once, CTA-wide, before the first tile: it only
  // waits on the previous launch's readers, never on this epoch.
  KOSMOS_DEVICE void build_all() {
    this->guard_data();
    const TraceSpan span;
    const RsParams<T>& a = this->p;
    RsSched<Pull> sched{this->ctrl, a.shape, this->epoch};
    RsHooks<T> hooks{a.x, this->template stage<float>(a.rank, 0), this->ctrl, this->epoch, a.shape, a.rows, a.K,
                     a.tile_n};
    const gemm::Problem prob{a.x, a.w, nullptr, a.tp * a.shape.T * Engine::kBM, a.N, a.K};
    Engine::run(prob, this->sm.tile, sched, hooks);
    if (threadIdx.x == 0) span.close(a.trace, blockIdx.x, kTraceBuild);
  }
};

// Dynamic shared memory is only padding: it makes two CTAs never fit on one SM.
template <typename T>
__global__ void __launch_bounds__(portable::kThreads, 1) tn_rs_kernel(const RsParams<T> p) {
  __shared__ RsShared sm;
  RsCtrl* ctrl = reinterpret_cast<RsCtrl*>(p.heap[p.rank] + p.ctrl_off);
  const uint64_t epoch = launch_epoch(&ctrl->epoch);
  RsOps<T> ops{{p, sm, ctrl, epoch, false}};
  rs_cta<Pull>(ops, p.shape, (int)blockIdx.x, (int)gridDim.x, p.reducers, p.switching != 0);
}

}  // namespace kosmos
