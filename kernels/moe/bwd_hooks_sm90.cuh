// The MoE backward megakernel's launch parameters and its engines' hooks
// (sm_90a; the kernel, its ops and launcher: moe/bwd_sm90.cuh, which says what
// each build kind computes). The hooks are the forward's (moe/fwd_sm90.cuh)
// for the backward's four GEMMs: the dgrads wait and complete the forward's
// row-block flags; the wgrads wait on their expert's dgrad2 tiles and
// contract its rows as their k range.
#pragma once
#include "gemm/sm90/tile_engine.cuh"
#include "moe/bwd_queues.h"
#include "moe/fwd_ctl.cuh"

namespace kosmos::moe {

template <class Dg, class Wg>
struct MoeBwdSm90Params {
  MoeFwdParams m;       // the CTA life's words, as moe/bwd_sm90.cuh says (R + S rows: rbs)
  sm90::Params<Dg> d2;  // dgrad2: A dY rows [R, H], B w2 as [E * I, H]: N = I, K = H
  sm90::Params<Dg> d1;  // dgrad1: A dh1 [R + S, 2I], B w1 as [E * H, 2I], C dX rows [R + S, H]: N = H, K = 2I
  sm90::Params<Wg> g2;  // wgrad2: A act as (I, R + S), B dY rows as (H, R), C dW2 [E * I, H]: K = R + S
  sm90::Params<Wg> g1;  // wgrad1: A x rows as (H, R), B dh1 as (2I, R + S), C dW1 [E * H, 2I]: K = R + S
  typename sm90::Params<Dg>::TmaC dgate, dup;  // dh1's gate and up columns: [R + S, I] each, row pitch 2I
  const bf16_t* h1;     // [R][2I] the forward's pre-activations
  MoeWgradTiles w;      // with cols2, cols1
  // The shared expert's (s.shared_blocks > 0; else copies of the routed ones):
  typename sm90::Params<Dg>::TmaA dy_in;  // dgrad2's A: dY [t, H]
  typename sm90::Params<Dg>::TmaB sw2;    // dgrad2's B: its down [I, H]
  typename sm90::Params<Dg>::TmaB sw1;    // dgrad1's B: its gate | up [H, 2I]
  typename sm90::Params<Wg>::TmaA x_mn;   // wgrad1's A: x [t, H] as (H, t)
  typename sm90::Params<Wg>::TmaB dy_mn;  // wgrad2's B: dY [t, H] as (H, t)
  const bf16_t* hs;                       // [t][2I] its pre-activations (the forward's)
  typename sm90::Params<Wg>::TmaC dsw2, dsw1;  // its dW2 [I, H] and dW1 [H, 2I]
};

// dgrad2 (kKind 1) and dgrad1 (2): a row block's tile waits as the forward's
// GEMM1 / GEMM2 tile does (its rows arrived; its row block's dgrad2 done) and
// completes the same flags.
template <class Dg, class Wg, int kKind>
struct MoeBwdDgradHooks : MoeRowTileCtl<MoeBwdBuilds<MoeCtl>, kKind> {
  static constexpr bool kTileDone = true, kRowsB = true, kMapsRows = kKind == 1, kStoreBoxes = kKind == 1;
  static constexpr bool kSplitA = kKind == 1, kBSource = true;  // the shared expert's dY, and weights
  using TmaA = typename sm90::Params<Dg>::TmaA;
  using TmaB = typename sm90::Params<Dg>::TmaB;
  using TmaC = typename sm90::Params<Dg>::TmaC;
  using MoeRowTileCtl<MoeBwdBuilds<MoeCtl>, kKind>::b;
  using MoeRowTileCtl<MoeBwdBuilds<MoeCtl>, kKind>::expert;
  using MoeRowTileCtl<MoeBwdBuilds<MoeCtl>, kKind>::shared;
  const MoeBwdSm90Params<Dg, Wg>* p;
  // dgrad2 of the shared expert: dY's token rows (past t: zeros, computed and never read).
  KOSMOS_DEVICE const TmaA* a_source(gemm::TileCoord t, int* rows, int* tile_m) const {
    if (!shared(t)) return nullptr;
    *rows = b->s.tokens;
    *tile_m = t.m - b->s.shared_rb0;
    return &p->dy_in;
  }
  KOSMOS_DEVICE const TmaB* b_source(gemm::TileCoord t) const {
    return !shared(t) ? nullptr : kKind == 1 ? &p->sw2 : &p->sw1;
  }
  KOSMOS_DEVICE int b_row0(gemm::TileCoord t) const {
    return shared(t) ? 0 : expert(t) * (kKind == 1 ? p->m.I : p->m.H);
  }
  // dgrad2's two tiles of dh1 and the pre-activations they need.
  KOSMOS_DEVICE sm90::StoreBox<TmaC> store_box(gemm::TileCoord t) const {
    return {&p->dup, p->m.rbs * Dg::kBM, p->m.I, t.m, t.n * Dg::kBN};
  }
  KOSMOS_DEVICE sm90::StoreBox<TmaC> gate_box(gemm::TileCoord t) const {
    return {&p->dgate, p->m.rbs * Dg::kBM, p->m.I, t.m, t.n * Dg::kBN};
  }
  // h1's arena row, or hs's token row (the shared expert's; none past t).
  KOSMOS_DEVICE const gemm::bf16* preact_row(gemm::TileCoord t, int r) const {
    if (!shared(t)) return reinterpret_cast<const gemm::bf16*>(p->h1) + (size_t)(t.m * Dg::kBM + r) * 2 * p->m.I;
    const int tok = (t.m - b->s.shared_rb0) * Dg::kBM + r;
    return tok < b->s.tokens ? reinterpret_cast<const gemm::bf16*>(p->hs) + (size_t)tok * 2 * p->m.I : nullptr;
  }
  KOSMOS_DEVICE int preact_cols() const { return p->m.I; }
  // Unreachable: dgrad2's tiles leave through their store boxes.
  template <class OutT>
  KOSMOS_DEVICE OutT* row_ptr(gemm::TileCoord, int) const {
    trap();
  }
};

// wgrad2 (kKind 3) and wgrad1 (4): tile row m is row block m % per of expert
// m / per's dW; it waits for every dgrad2 tile of the expert's row blocks and
// contracts them (none: zeros). Nothing waits on a wgrad tile. The shared
// expert (x = e_local) contracts its arena rows of act (wgrad2) or dh1
// (wgrad1) against dY's or x's token rows.
template <class Dg, class Wg, int kKind>
struct MoeBwdWgradHooks {
  static constexpr bool kTileDone = false, kSplitA = true, kKRange = true, kBSource = true;
  static constexpr bool kMapsRows = true, kStoreBoxes = true;  // the shared expert's dW have arrays of their own
  using TmaA = typename sm90::Params<Wg>::TmaA;
  using TmaB = typename sm90::Params<Wg>::TmaB;
  using TmaC = typename sm90::Params<Wg>::TmaC;
  const MoeBwdSm90Params<Dg, Wg>* p;
  MoeBwdBuilds<MoeCtl>* b;

  KOSMOS_DEVICE int rows() const { return kKind == 3 ? p->m.I : p->m.H; }  // dW's rows per expert
  KOSMOS_DEVICE bool shared(gemm::TileCoord t) const { return t.m / (rows() / Wg::kBM) == b->s.e_local; }
  KOSMOS_DEVICE const TmaB* b_source(gemm::TileCoord t) const {
    return kKind == 3 && shared(t) ? &p->dy_mn : nullptr;
  }
  KOSMOS_DEVICE sm90::StoreBox<TmaC> store_box(gemm::TileCoord t) const {
    const sm90::Params<Wg>& g = kKind == 3 ? p->g2 : p->g1;
    if (shared(t)) return {kKind == 3 ? &p->dsw2 : &p->dsw1, rows(), g.N, t.m % (rows() / Wg::kBM), t.n * Wg::kBN};
    return {&g.tma_c, g.M, g.N, t.m, t.n * Wg::kBN};
  }
  // Unreachable: every tile leaves through its store boxes.
  template <class OutT>
  KOSMOS_DEVICE OutT* row_ptr(gemm::TileCoord, int) const {
    trap();
  }
  KOSMOS_DEVICE void before_tile(gemm::TileCoord t) {
    b->start(MoeTile{kKind, -1, t.m / (rows() / Wg::kBM), 0});
  }
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(gemm::TileCoord) {}
  KOSMOS_DEVICE const TmaA* a_source(gemm::TileCoord t, int* a_rows, int* tile_m) const {
    *a_rows = rows();
    *tile_m = t.m % (rows() / Wg::kBM);
    return kKind == 3 ? &p->g2.tma_a : shared(t) ? &p->x_mn : &p->g1.tma_a;
  }
  KOSMOS_DEVICE void k_range(gemm::TileCoord t, int* a_kb0, int* b_kb0, int* kblocks) const {
    constexpr int kPer = Wg::kBM / Wg::kBK;  // k-blocks per row block
    if (shared(t)) {  // its arena rows from shared_rb0 against token rows from 0
      const int arena = b->s.shared_rb0 * kPer;
      *a_kb0 = kKind == 3 ? arena : 0;
      *b_kb0 = kKind == 3 ? 0 : arena;
      *kblocks = b->s.shared_blocks * kPer;
      return;
    }
    const int x = t.m / (rows() / Wg::kBM), lo = b->L.rb[x], hi = b->L.rb[x + 1];
    *a_kb0 = *b_kb0 = lo * kPer;
    *kblocks = (hi - lo) * kPer;
  }
};

}  // namespace kosmos::moe
