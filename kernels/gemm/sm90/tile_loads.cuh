// Hopper tile engine (gemm/sm90/tile_engine.cuh): the loading thread's loads
// of one tile, k-block by k-block, into the ring of shared-memory stages; TMA
// for A and B, completing on each stage's full barrier (expect_tx of the
// stage's bytes). Hooks (gemm/tile_hooks.h) may redirect the sources.
#pragma once
#include "gemm/sm90/barrier.cuh"
#include "gemm/sm90/tile_config.cuh"
#include "gemm/tile_hooks.h"

namespace kosmos::sm90 {

template <class Cfg, class Hooks>
struct TileLoads {
  using P = Params<Cfg>;
  using S = SharedStorage<Cfg>;
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using BK = typename Cfg::BK;
  static constexpr int kStages = Cfg::kStages;

  // The k-blocks tile t contracts, return of them from A's *a_kb0 and B's
  // *b_kb0: all of K, or the hooks' range (kKRange: a grouped weight
  // gradient's expert rows).
  static CUTE_DEVICE int k_blocks(const P& p, gemm::TileCoord t, Hooks& h, int* a_kb0, int* b_kb0) {
    *a_kb0 = *b_kb0 = 0;
    int kblocks = gemm::ceil_div(p.K, Cfg::kBK);
    if constexpr (gemm::ranges_k_v<Hooks>) h.k_range(t, a_kb0, b_kb0, &kblocks);
    return kblocks;
  }

  // B as the (N, K) coordinate tensor TMA reads, from row b_row0 (kRowsB: the
  // first row of tile t's operand in a stack of them along n).
  static CUTE_DEVICE auto b_rows(const P& p, const typename P::TmaB& tma_b, gemm::TileCoord t, Hooks& h) {
    if constexpr (gemm::rows_b_v<Hooks>) {
      return domain_offset(make_coord(h.b_row0(t), 0), tma_b.get_tma_tensor(make_shape(p.N, p.K)));
    } else {
      return tma_b.get_tma_tensor(make_shape(p.N, p.K));
    }
  }

  // Producer thread: stream tile t's k-blocks of A and B into the ring. Hooks may
  // name another A (kSplitA a_source: [a_rows, K] in parameter space, at tile row
  // a_tile_m), another B (kBSource b_source), B's first k-block (kGroupedB) or
  // row (kRowsB), B's two half-blocks (kSplitB), or the k-blocks to contract
  // (kKRange); one load loop: 40 registers.
  static CUTE_DEVICE void produce_tile(const P& p, S& s, Ring& ring, gemm::TileCoord t, Hooks& h) {
    const typename P::TmaA* a = &p.tma_a;
    int a_rows = p.M, a_tile_m = t.m;
    if constexpr (gemm::split_a_v<Hooks>) {
      int r = 0, m = 0;
      if (const typename P::TmaA* other = h.a_source(t, &r, &m)) a = other, a_rows = r, a_tile_m = m;
    }
    const typename P::TmaB* b = &p.tma_b;
    if constexpr (gemm::sources_b_v<Hooks>) {
      if (const typename P::TmaB* other = h.b_source(t)) b = other;
    }
    int b_kb0 = 0, b_lo = 0, b_hi = 0;
    if constexpr (gemm::groups_b_v<Hooks>) b_kb0 = h.b_kblock0(t);
    const typename P::TmaBHalf* b_half = nullptr;
    if constexpr (gemm::splits_b_v<Hooks>) b_half = h.b_halves(t, &b_lo, &b_hi);
    const typename P::TmaA& tma_a = *a;
    const typename P::TmaB& tma_b = *b;
    Tensor gA =
        local_tile(tma_a.get_tma_tensor(make_shape(a_rows, p.K)), make_shape(BM{}, BK{}), make_coord(a_tile_m, _));
    Tensor gB = local_tile(b_rows(p, tma_b, t, h), make_shape(BN{}, BK{}), make_coord(t.n, _));
    Tensor sA = make_tensor(make_smem_ptr(s.sa()), typename Cfg::RingA{});
    Tensor sB = make_tensor(make_smem_ptr(s.sb()), typename Cfg::RingB{});
    // (TMA, k-block) sources and (TMA, stage) destinations.
    auto [tAg, tAs] = tma_partition(tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
    auto [tBg, tBs] = tma_partition(tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB), group_modes<0, 2>(gB));
    int a_k0 = 0, b_k0 = 0;
    const int kblocks = k_blocks(p, t, h, &a_k0, &b_k0);
    b_k0 += b_kb0;
    for (int k = 0; k < kblocks; ++k) {
      h.before_k(t, (a_k0 + k) * Cfg::kBK);
      mbar_wait(&s.empty[ring.slot], ring.phase ^ 1, "stage empty");
      mbar_arrive_expect_tx(&s.full[ring.slot], Cfg::kStageBytes);
      copy(tma_a.with(s.full[ring.slot]), tAg(_, a_k0 + k), tAs(_, ring.slot));
      if constexpr (gemm::splits_b_v<Hooks>) {
        load_b_halves(*b_half, p, s, ring.slot, b_lo, b_hi, b_k0 + k);
      } else {
        copy(tma_b.with(s.full[ring.slot]), tBg(_, b_k0 + k), tBs(_, ring.slot));
      }
      ring.advance(kStages);
    }
  }
};

}  // namespace kosmos::sm90
