// Fused GEMM + reduce-scatter with Hopper builders (sm_90a): the queues, bands,
// flags and epochs of gemm_rs.cuh, with builders that are the TMA + WGMMA tile
// engine. The CTA life is rs_cta (tp/rs_sched.h): the engine's claimer thread
// claims GEMM tiles (RsSched, marking each step claimed), the epilogue stages
// partial tiles, tile_done counts the band and publishes it; once the GEMM
// queue is empty the CTA reduces (one way). Reducers never build.
//
// Staging type StageT: float (partials exact to fp32) or bf16 (half the bytes
// written, and carried over NVLink, per partial). Pull: partials are
// staged here and the peers' reducers pull them; push (Tr = Push): the
// epilogue writes each partial into its chunk owner's staging (rs_staged). Either way the
// reducers sum the ranks in fp32 in rank order and round once, so the result is
// bitwise reproducible; bf16 partials are rounded once each, as XLA's bf16 dot
// output is before its psum_scatter. Fold (Tr = PushFold, with bf16
// staging): no reducers; the epilogue of each own-chunk tile adds the peers'
// pushed partials in rank order and rounds once into Y (combine below).
//
// A is x read as one [tp * rows, K] matrix; chunk c's tile row tr is engine tile
// row c * T + tr, so rows % kBM == 0 (a tile never straddles two chunks: the
// launcher checks). Staged tiles are kBM x Cfg::kBN of StageT.
#pragma once
#include <type_traits>

#include "gemm/sm90/tile_engine.cuh"
#include "kosmos/pull.h"
#include "kosmos/push.h"
#include "tp/rs_ops.cuh"
#include "tp/rs_fold_sm90.cuh"
#include "tp/rs_reduce_sm90.cuh"

namespace kosmos {

template <class Cfg>
struct RsSm90Params {
  using TmaC = typename sm90::Params<Cfg>::TmaC;
  RsParams<bf16_t> rs;  // tile_n == Cfg::kBN, shape.NT in units of it
  sm90::Params<Cfg> g;  // TMA over x [tp * rows, K] and W [K, N]
  // bf16 staging (the staged epilogue): TMA stores into each rank's staging,
  // as [tp * T * NT * kBM, tile_n] (slot s = rows [s * kBM, (s + 1) * kBM)),
  // and, for the fold's own tiles, into y [rows, N].
  TmaC stage_map[kMaxRanks];
  TmaC y_map;
};

struct RsSm90Shared {
  int bcast;
  static KOSMOS_DEVICE const char* kernel() { return "tn_rs_sm90"; }
};

// By value (see AgSm90Hooks): the epilogue stores through row_ptr. A peer's
// heap (push only) is looked up in the kernel parameters (`rs`, __grid_constant__,
// so no local copy): per-rank arrays held here would live in local memory.
// Tr is the transport (kosmos/pull.h, kosmos/push.h), the kernel's: the pull
// kernel compiles no push code, which keeps the register budget of its
// producer warp group, 40. Tr::home names the rank whose staging holds a partial.
// Tr::kFold (PushFold, bf16 staging): own-chunk tiles are combined with the
// peers' partials in the epilogue and go straight to Y.
template <class Cfg, class StageT, class Tr>
struct RsSm90Hooks {
  static constexpr bool kFold = Tr::kFold;
  static constexpr bool kTileDone = true, kMapsRows = true;
  static constexpr bool kStoreBoxes = sizeof(StageT) == 2;  // bf16 partials leave by TMA store (store_box)
  static_assert(!kFold || sizeof(StageT) == 2, "fold: bf16 staging");
  using TmaC = typename RsSm90Params<Cfg>::TmaC;
  const RsParams<bf16_t>* rs;
  const RsSm90Params<Cfg>* maps;  // the kernel parameters (stage_map, y_map: TMA reads them there)
  RsCtrl* ctrl;   // ours
  StageT* stage;  // our staging: heap + kHeapDataOffset
  uint64_t epoch, timeout_ns;
  RsShape s;
  int rows, tile_n, rank;
  uint32_t ready_seen = 0;  // claimer thread (before_tile), push: peers whose ready[] it has seen this epoch

  KOSMOS_DEVICE RsCtrl* ctrl_at(int r) const {
    return r == rank ? ctrl : reinterpret_cast<RsCtrl*>(rs->heap[r] + rs->ctrl_off);
  }
  KOSMOS_DEVICE StageT* stage_at(int r) const {
    return r == rank ? stage : reinterpret_cast<StageT*>(rs->heap[r] + kHeapDataOffset);
  }

  // Push: the tile's partial goes to its chunk's owner, whose staging may still
  // be read for the previous epoch until the owner announces it free. The
  // producer waits before the tile's loads; the consumers' stores of the tile
  // come after its mainloop, which those loads feed.
  KOSMOS_DEVICE void before_tile(gemm::TileCoord t) {
    const int chunk = t.m / s.T;
    if (!Tr::kPush || chunk == rank || (ready_seen >> chunk & 1u)) return;
    wait_ge<Scope::kSys>(&ctrl->ready[chunk], epoch, timeout_ns, {"tn_rs_sm90", rank, (int)blockIdx.x, "peer_ready",
                                                                  chunk});
    ready_seen |= 1u << chunk;
  }
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}

  // Tile t's staging: the rank (home) and slot rs_staged() names (ours under
  // pull, the chunk owner's under push).
  struct Slot {
    int home, slot;
  };
  KOSMOS_DEVICE Slot slot_of(gemm::TileCoord t) const {
    const int chunk = t.m / s.T, tr = t.m - chunk * s.T, band = tr / s.R;
    const RsStaged h = rs_staged<Tr>(rank, chunk);
    return {h.home, rs_stage_slot(s, band, h.pos, rs_band_index(s, tr - band * s.R, t.n))};
  }
  KOSMOS_DEVICE StageT* tile_of(gemm::TileCoord t) const {
    const Slot at = slot_of(t);
    return stage_at(at.home) + (size_t)at.slot * rs_tile_elems(tile_n);
  }

  // Engine row r of tile t lands in row r - t.m * kBM of the tile's staging
  // slot; element (r, c) at [c] (c counts from the tile's first column). A
  // folded tile's rows are Y's: chunk-local row, N wide.
  template <class OutT>
  KOSMOS_DEVICE OutT* row_ptr(gemm::TileCoord t, int r) const {
    const int in_tile = r - t.m * kTileRows, row = (t.m % s.T) * kTileRows + in_tile;
    if (row >= rows) return nullptr;  // past the chunk: never read
    static_assert(sizeof(OutT) == sizeof(StageT), "the engine stores the staging type");
    if (combines(t)) return reinterpret_cast<OutT*>(rs->y + (size_t)row * rs->N);
    return reinterpret_cast<OutT*>(tile_of(t) + (ptrdiff_t)(in_tile - t.n) * tile_n);
  }

  KOSMOS_DEVICE bool combines(gemm::TileCoord t) const { return kFold && t.m / s.T == rank; }

  // The TMA store of tile t (kStoreBoxes): row_ptr's destination as a box. A
  // staging slot takes the whole tile (rows past the chunk are never read).
  KOSMOS_DEVICE sm90::StoreBox<TmaC> store_box(gemm::TileCoord t) const {
    if (combines(t)) return {&maps->y_map, rows, rs->N, t.m % s.T, t.n * tile_n};
    const Slot at = slot_of(t);
    return {&maps->stage_map[at.home], s.tp * s.T * s.NT * kTileRows, tile_n, at.slot, 0};
  }

#ifdef KOSMOS_TRACE
  // Per-tile spans (consumer thread 0 only appends while the engine runs):
  // mainloop = build, the previous tile's retire and the staging = wait, the
  // fold's combine = reduce, the copies' issue = idle; tile = engine tile
  // row << 12 | column.
  static constexpr bool kTraceTiles = true;
  uint64_t phase_ns = 0;
  KOSMOS_DEVICE void tile_phase(gemm::TileCoord t, gemm::TilePhase ph) {
    const uint64_t now = trace_now();
    if (ph == gemm::TilePhase::kCombined && !combines(t)) return;
    if (ph != gemm::TilePhase::kClaimed) {
      const uint8_t role = ph == gemm::TilePhase::kComputed ? kTraceBuild
                           : ph == gemm::TilePhase::kStaged ? kTraceWait
                           : ph == gemm::TilePhase::kCombined ? kTraceReduce : kTraceIdle;
      trace_append(rs->trace, blockIdx.x, role, phase_ns, now, t.m << 12 | t.n);
    }
    phase_ns = now;
  }
#endif

  // One consumer thread: every peer's partial of this band of our chunk has
  // been pushed here (pub[], released after the pushes' writes completed). The
  // engine's barrier after it orders every consumer's loads behind the acquire.
  KOSMOS_DEVICE void before_combine(gemm::TileCoord t) {
    const int band = own_band(t);
    for (int src = 0; src < s.tp; ++src) {
      if (src == rank) continue;
      const TraceSpan wait;
      wait_ge<Scope::kSys>(&ctrl->pub[rs_flag_index(band, src)], epoch, timeout_ns,
                           {"tn_rs_sm90", rank, (int)blockIdx.x, "pub(fold)", src * kRsMaxBands + band});
      wait.close(rs->trace, blockIdx.x, kTraceWait, band);
    }
  }

  // before_combine's acquire without its wait, for the engine's producer
  // thread once the tile's loads are issued (gemm/tile_hooks.h): one poll of
  // each peer's flag.
  KOSMOS_DEVICE bool try_before_combine(gemm::TileCoord t) const {
    const int band = own_band(t);
    for (int src = 0; src < s.tp; ++src)
      if (src != rank && load_acquire<Scope::kSys>(&ctrl->pub[rs_flag_index(band, src)]) < epoch) return false;
    return true;
  }

  // The other term of a two-rank fold (the engine prefetches only two-term
  // combines, so tp == 2 and the peer is 1 - rank): the peer's partial, pushed
  // into our staging, read through our staging's map.
  KOSMOS_DEVICE sm90::LoadBox prefetch_box(gemm::TileCoord t) const {
    return {maps->stage_map[rank].get_tma_descriptor(), staged_slot(t, 1 - rank) * kTileRows, 0};
  }

  // The fold's terms (gemm/tile_hooks.h combine): every rank's partial of tile
  // t, ranks in order (the reducers' sum, term for term); ours is the engine's
  // own rounded tile, the peers' were pushed into our staging.
  KOSMOS_DEVICE int combine_terms(gemm::TileCoord) const { return s.tp; }
  KOSMOS_DEVICE int combine_own(gemm::TileCoord) const { return rank; }
  KOSMOS_DEVICE const StageT* combine_src(gemm::TileCoord t, int term) const {
    return stage + (size_t)staged_slot(t, term) * rs_tile_elems(tile_n);
  }
  // Our staging slot of rank `term`'s partial of own-chunk tile t.
  KOSMOS_DEVICE int staged_slot(gemm::TileCoord t, int term) const {
    const int band = own_band(t);
    return rs_stage_slot(s, band, term, rs_band_index(s, t.m - rank * s.T - band * s.R, t.n));
  }
  // The band of own-chunk tile t.
  KOSMOS_DEVICE int own_band(gemm::TileCoord t) const { return (t.m - rank * s.T) / s.R; }

  // One consumer thread after a named barrier over every consumer's stores
  // (and, staged, after the copies' writes completed: the engine's retire): the
  // acq_rel count makes the band's completer acquire every tile of it, so its
  // release of pub[] (ours, or under push the owner's) covers the whole band
  // (as gemm_rs.cuh's band_add).
  KOSMOS_DEVICE void tile_done(gemm::TileCoord t) {
    if (combines(t)) return;  // went to Y: nothing staged (rs_tile_done)
    const int chunk = t.m / s.T, band = (t.m - chunk * s.T) / s.R;
    if (add_acq_rel_gpu_u32(&ctrl->band_count[rs_flag_index(band, chunk)], 1) + 1 !=
        (uint32_t)rs_band_tiles(s, band))
      return;
    const RsStaged h = rs_staged<Tr>(rank, chunk);
    store_release<Scope::kSys>(&ctrl_at(h.home)->pub[rs_flag_index(band, h.pos)], epoch);
  }
};

template <class Cfg, class StageT, class Tr>
struct RsSm90Ops : RsDeviceOps<bf16_t, Tr, RsSm90Shared> {
  const RsSm90Params<Cfg>& pp;
  sm90::SharedStorage<Cfg>& s;

  KOSMOS_DEVICE StageT* tile(int r, int slot) const { return this->template stage<StageT>(r, slot); }

  // The staging guard is taken once, CTA-wide, before the first tile: it only
  // waits on the previous launch's readers, never on this epoch.
  KOSMOS_DEVICE void build_all() {
    this->guard_data();
    const RsParams<bf16_t>& a = this->p;
    RsSched<Tr> sched{this->ctrl, a.shape, this->epoch};
    using Hooks = RsSm90Hooks<Cfg, StageT, Tr>;
    Hooks hooks{&a, &pp, this->ctrl, tile(a.rank, 0), this->epoch, a.timeout_ns, a.shape, a.rows, a.tile_n, a.rank};
    using EngineOut = std::conditional_t<std::is_same_v<StageT, float>, float, gemm::bf16>;
    if constexpr (Tr::kFold) {
      sm90::TileEngine<Cfg, EngineOut, Hooks, FoldStaging>::run(pp.g, s, sched, hooks);
    } else {
      sm90::TileEngine<Cfg, EngineOut, Hooks>::run(pp.g, s, sched, hooks);
    }
    __syncthreads();  // the engine's warp groups leave at different times (the hooks traced each tile)
  }

  KOSMOS_DEVICE void reduce(const RsSlice& sl) { RsSm90Reduce<StageT, Tr>::reduce(*this, sl); }
};

template <class Cfg, class StageT, class Tr>
__global__ void __launch_bounds__(Cfg::kThreads, 1) tn_rs_sm90_kernel(const __grid_constant__ RsSm90Params<Cfg> p) {
  static_assert(Cfg::kBM == kTileRows, "staging and reduction use 128-row tiles");
  extern __shared__ char smem_raw[];
  __shared__ RsSm90Shared sm;
  auto& s = sm90::shared_storage<Cfg>(smem_raw);
  RsCtrl* ctrl = reinterpret_cast<RsCtrl*>(p.rs.heap[p.rs.rank] + p.rs.ctrl_off);
  const uint64_t epoch = launch_epoch(&ctrl->epoch);
  RsSm90Ops<Cfg, StageT, Tr> ops{{p.rs, sm, ctrl, epoch, false}, p, s};
  rs_cta<Tr>(ops, p.rs.shape, (int)blockIdx.x, (int)gridDim.x, p.rs.reducers, p.rs.switching != 0);
}

}  // namespace kosmos
