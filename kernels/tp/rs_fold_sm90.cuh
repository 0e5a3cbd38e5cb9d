// GEMM+RS's fold (push_fold) as the Hopper engine's staging type
// (gemm/sm90/staging.cuh): an own-chunk tile leaves as the fp32 sum of every
// rank's partial of it, in rank order, rounded once (the reducers' sum, term
// for term: tp/rs_sched.h); the peers' partials were pushed into our staging.
// Other tiles are staged plainly. The hooks (tp/gemm_rs_sm90.cuh RsSm90Hooks)
// say which tiles combine, how many terms, where each lies and how to wait.
//
// Two-term folds (TP 2) load the peer's term into s.c under the mainloop
// instead of reading it from global memory after it: the 64 KB of loads the
// combine waited for after the mainloop (~3.5 us a 128x256 tile, most of a
// K = 512 mainloop: trace spans, loopback GEMM+RS, 2026-12-01) then land while
// the tensor cores still work, and the sum rides on the staging (stage_tile
// kAddStaged).
//
// Per such tile, strictly alternating: consumer thread 0, which alone can wait
// for the previous tile's stores (its bulk group), frees s.c early in the
// mainloop (c_free); the producer, once it has issued the tile's last loads,
// polls the term's readiness once (never waits: the tile's fallback is the
// combine after the mainloop, whose wait is the one the schedule is built
// around) and offers on c_ready, loading the term or not (c_loaded); the
// consumers wait for the offer after the mainloop. The first version polled
// from consumer thread 0 in the mainloop: its stalls there held a quarter of a
// tensor-core warp group and the combining tiles' mainloops grew 1-3 us
// (loopback trace spans, 2026-12-01).
#pragma once
#include "gemm/sm90/staging.cuh"
#include "gemm/sm90/tile_combine.cuh"

namespace kosmos {

template <class Cfg, class OutT, bool kBoxes, class Hooks>
struct FoldStaging {
  static_assert(kBoxes, "the fold stages swizzled boxes (bf16 partials leave by TMA store)");
  using P = sm90::Params<Cfg>;
  using S = sm90::SharedStorage<Cfg>;
  static constexpr int kOutCols = Cfg::kBN;
  static constexpr uint32_t kConsumerThreads = 128 * Cfg::kConsumerWGs;
  static constexpr uint32_t kTileBytes = Cfg::kBN / Cfg::kOutBoxCols * Cfg::kOutBoxBytes;  // load_boxes' boxes
  uint32_t c_phase = 0;  // consumers: the parity of the next c_ready phase

  static CUTE_DEVICE void init(S& s) {
    sm90::mbar_init(&s.c_free, 1);   // consumer thread 0: the previous tile's stores have read s.c
    sm90::mbar_init(&s.c_ready, 1);  // the producer's offer: its arrive (with the term's bytes, if it loads one)
    s.c_offers = 0;
  }

  static CUTE_DEVICE bool prefetches(const P& p, Hooks& h, gemm::TileCoord t) {
    return p.K > 0 && h.combines(t) && h.combine_terms(t) == 2;  // K > 0: the consumers' mainloop frees s.c
  }

  // The loading thread, after tile t's loads: the offer.
  CUTE_DEVICE void after_loads(const P& p, S& s, gemm::TileCoord t, Hooks& h) {
    if (!prefetches(p, h, t)) return;
    const uint32_t n = s.c_offers;
    sm90::mbar_wait(&s.c_free, n & 1u, "staged buffer free for a prefetch");
    const bool go = h.try_before_combine(t);
    s.c_loaded = go;
    if (go) {
      gemm::async_proxy_fence();  // the acquire covers TMA's reads of the term
      sm90::mbar_arrive_expect_tx(&s.c_ready, kTileBytes);
      sm90::load_boxes<Cfg>(s, h.prefetch_box(t), &s.c_ready);
    } else {
      sm90::mbar_arrive(&s.c_ready);
    }
    s.c_offers = n + 1;
  }

  // Consumer thread 0 frees s.c two k-blocks into a prefetching tile's
  // mainloop: by then the previous tile's stores, issued just before it, have
  // usually read it.
  CUTE_DEVICE auto in_mainloop(const P& p, S& s, gemm::TileCoord t, Hooks& h, int ctid) {
    const bool frees = ctid == 0 && prefetches(p, h, t);
    return [frees, &s](int k, int kblocks) {
      if (frees && k == (kblocks < 3 ? kblocks - 1 : 2)) {
        sm90::bulk_wait_reads();
        sm90::mbar_arrive(&s.c_free);
      }
    };
  }

  // Consumers, tile t into s.c: with the prefetched term summed in as it is
  // staged, or staged, then combined (gemm/sm90/tile_combine.cuh combine_tile;
  // the wait comes after the mainloop and after the engine's retire, which has
  // posted the previous tile to the publisher, so no tile_done waits behind it:
  // tp/rs_sched.h, fold).
  template <class Thr, class Acc, class Phase>
  CUTE_DEVICE void stage(const P& p, S& s, gemm::TileCoord t, Hooks& h, int ctid, const Thr& thr, const Acc& acc,
                         const Phase& phase) {
    if (prefetches(p, h, t)) {
      sm90::mbar_wait(&s.c_ready, c_phase, "producer's prefetch offer");
      c_phase ^= 1;
      // Every consumer reads c_loaded; the producer writes it again only
      // after c_free, which thread 0 arrives on after the consumers' barrier
      // that follows this read (the engine's: the whole tile is staged).
      // racecheck does not follow that chain and reports the pair (2026-12-01).
      if (s.c_loaded) {  // the term has landed in s.c
        sm90::stage_tile<Cfg, OutT, kBoxes, /*kAddStaged=*/true>(s, thr, acc);
        phase(gemm::TilePhase::kStaged);
        phase(gemm::TilePhase::kCombined);
        return;
      }
    }
    sm90::stage_tile<Cfg, OutT, kBoxes>(s, thr, acc);
    phase(gemm::TilePhase::kStaged);
    combine(h, s, t, ctid);
    phase(gemm::TilePhase::kCombined);
  }

  // The barrier hands thread 0's acquire to every consumer and orders every
  // consumer's staging before the pass, which rewrites s.c in place.
  static CUTE_DEVICE void combine(Hooks& h, S& s, gemm::TileCoord t, int ctid) {
    if (!h.combines(t)) return;
    if (ctid == 0) h.before_combine(t);
    sm90::named_barrier(sm90::kConsumerBarrier, kConsumerThreads);
    auto src = [&](int term) { return h.combine_src(t, term); };
    sm90::combine_tile<Cfg, kBoxes>(s, ctid, h.combine_terms(t), h.combine_own(t), src);
  }

  // A combining tile needs the staged buffer (the launcher keeps N % 8 == 0).
  CUTE_DEVICE void unstaged(Hooks& h, gemm::TileCoord t) {
    if (h.combines(t)) __trap();
  }
};

}  // namespace kosmos
