// How a computed tile enters the Hopper engine's staged buffer s.c: the
// engine's one extension point beside the hooks (gemm/tile_hooks.h). The
// engine takes a staging type as a template and calls each member at one
// moment of a tile's life:
//
//  init(s)                         thread 0, among the engine's barrier inits
//  after_loads(p, s, t, h)         the loading thread, once tile t's loads are
//                                  issued (it must not wait on the consumers:
//                                  the next tile's loads queue behind it)
//  in_mainloop(p, s, t, h, ctid)   consumers, before tile t's mainloop: a
//                                  callable (k, kblocks) that every consumer
//                                  thread runs once k-block k's batch is in
//                                  flight (short side work; the tensor cores
//                                  have a batch to chew on)
//  stage(p, s, t, h, ctid, thr, acc, phase)  consumers, after the previous
//                                  tile's copies have read s.c: tile t into s.c
//  unstaged(h, t)                  consumers, when t leaves from registers
//                                  (N % 8 != 0: no staged buffer)
//  kOutCols                        the columns stage() puts in s.c (kBN, or
//                                  fewer: the first kOutCols / 64 boxes leave)
//
// PlainStaging rounds the tile in. GEMM+RS's fold passes its own
// (tp/rs_fold_sm90.cuh: it sums the peers' partials into the tile, one of
// them prefetched under the mainloop), so the engine carries no op's epilogue.
#pragma once
#include "gemm/sm90/epilogue.cuh"
#include "gemm/tile_hooks.h"

namespace kosmos::sm90 {

template <class Cfg, class OutT, bool kBoxes, class Hooks>
struct PlainStaging {
  static constexpr int kOutCols = Cfg::kBN;
  static CUTE_DEVICE void init(SharedStorage<Cfg>&) {}
  CUTE_DEVICE void after_loads(const Params<Cfg>&, SharedStorage<Cfg>&, gemm::TileCoord, Hooks&) {}
  CUTE_DEVICE auto in_mainloop(const Params<Cfg>&, SharedStorage<Cfg>&, gemm::TileCoord, Hooks&, int) {
    return [](int, int) {};
  }
  template <class Thr, class Acc, class Phase>
  CUTE_DEVICE void stage(const Params<Cfg>&, SharedStorage<Cfg>& s, gemm::TileCoord, Hooks&, int, const Thr& thr,
                         const Acc& acc, const Phase& phase) {
    stage_tile<Cfg, OutT, kBoxes>(s, thr, acc);
    phase(gemm::TilePhase::kStaged);
  }
  CUTE_DEVICE void unstaged(Hooks&, gemm::TileCoord) {}
};

}  // namespace kosmos::sm90
