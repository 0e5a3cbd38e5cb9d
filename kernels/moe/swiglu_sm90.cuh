// The MoE GEMM1's SwiGLU as the Hopper engine's staging type
// (gemm/sm90/staging.cuh): a 128x256 tile of gate|up pre-activations (its B
// rows paired by the split-B hook: columns [0, 128) gate block n, [128, 256)
// the matching up block, moe/grouped_gemm_sm90.cuh) leaves as the 128x128 bf16
// tile h = silu(gate) * up, two swizzled boxes instead of four. The tile's
// destination is the hooks' store_box (h [M, I] at column 128 n).
//
// The arithmetic (moe_swiglu, moe/swiglu.h) is the pure-JAX twin's and the
// portable engine's: gate and up rounded to bf16, then silu(g) * u in fp32,
// rounded once. Where the hooks say (kKeepsPreact: preact_box), the tile's
// bf16 gate and up pre-activations leave first, through the same staged
// buffer: staged as a plain 128x256 tile, stored by TMA as its gate half and
// its up half, and read out of s.c before h is staged over it. (Stored from
// registers instead, 4 bytes a thread at a time, they cost the forward 5-15%:
// the consumers' epilogue waited on them, benchmarks/RESULTS.md.)
#pragma once
#include <type_traits>

#include "gemm/sm90/barrier.cuh"
#include "gemm/sm90/bulk_store.cuh"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/tile_hooks.h"
#include "moe/swiglu.h"

namespace kosmos::moe {

template <class Cfg, class OutT, bool kBoxes, class Hooks>
struct SwigluStaging {
  static_assert(kBoxes, "h leaves by TMA store: hooks with kMapsRows and kStoreBoxes");
  static_assert(std::is_same_v<OutT, gemm::bf16>, "h is bf16");
  static_assert(Cfg::kBN / 2 % Cfg::kOutBoxCols == 0, "gate and up halves of whole 64-column boxes");
  static constexpr int kOutCols = Cfg::kBN / 2;
  using S = sm90::SharedStorage<Cfg>;
  using P = sm90::Params<Cfg>;

  static CUTE_DEVICE void init(S&) {}
  CUTE_DEVICE void after_loads(const P&, S&, gemm::TileCoord, Hooks&) {}
  CUTE_DEVICE auto in_mainloop(const P&, S&, gemm::TileCoord, Hooks&, int) {
    return [](int, int) {};
  }

  // stage_tile's stmatrix steps over h's kOutCols columns: accumulator i is
  // gate column c of its row, i + kBN / 4 up column c + kBN / 2 (4 accumulators
  // per 8-column group; tests/host/sm90_staged_layout.cu), so each thread's h
  // is its own registers' and h's boxes are where a kOutCols-wide plain tile's
  // would be. Called after the previous tile's stores have read s.c.
  template <class Thr, class Acc, class Phase>
  CUTE_DEVICE void stage(const P&, S& s, gemm::TileCoord t, Hooks& h, int ctid, const Thr& thr, const Acc& acc,
                         const Phase& phase) {
    static_assert(decltype(cute::size(acc))::value == Cfg::kBN / 2, "one 64xBN wgmma accumulator per consumer thread");
    if constexpr (gemm::keeps_preact_v<Hooks>) {  // the floor's SwiGLU GEMM keeps none
      sm90::StoreBox<typename P::TmaC> gate, up;
      if (h.preact_box(t, &gate, &up)) {
        constexpr uint32_t kConsumers = 128 * Cfg::kConsumerWGs;
        sm90::stage_tile<Cfg, gemm::bf16, true>(s, thr, acc);  // gate | up, rounded as the twin's h1
        sm90::smem_to_async_proxy_fence();
        sm90::named_barrier(sm90::kConsumerBarrier, kConsumers);
        if (ctid == 0) {
          sm90::store_boxes<Cfg, Cfg::kBN / 2>(s, gate, 0);
          sm90::store_boxes<Cfg, Cfg::kBN / 2>(s, up, Cfg::kBN / 2 / Cfg::kOutBoxCols);
          sm90::bulk_commit();
          sm90::bulk_wait_reads();  // s.c is read before h is staged over it
        }
        sm90::named_barrier(sm90::kConsumerBarrier, kConsumers);
      }
    }
    constexpr int kUp = Cfg::kBN / 4;
    auto coord = thr.partition_C(cute::make_identity_tensor(cute::Shape<typename Cfg::BM, typename Cfg::BN>{}));
    const int rw = cute::get<0>(coord(0)) & ~15;  // the warp's first row
    const uint32_t lane_at = sm90::smem_u32(s.c) + sm90::stmatrix_lane_offset<Cfg, true>(rw, int(threadIdx.x % 32));
    CUTE_UNROLL
    for (int q = 0; q < kOutCols / 16; ++q) {
      uint32_t r[4];
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) {
        const int i = 8 * q + 2 * j;
        r[j] = sm90::pack_bf16x2(moe_swiglu(acc(i), acc(i + kUp)), moe_swiglu(acc(i + 1), acc(i + 1 + kUp)));
      }
      sm90::stmatrix_x4(sm90::stmatrix_offset<Cfg, true>(lane_at, q), r);
    }
    phase(gemm::TilePhase::kStaged);
  }

  CUTE_DEVICE void unstaged(Hooks&, gemm::TileCoord) {}
};

}  // namespace kosmos::moe
