// Epilogue of the Hopper engine: fp32 accumulators from registers straight to
// global memory, rounded once to the output type (bf16 for a finished product,
// fp32 for partials another pass reduces). Edge tiles are masked per element.
//
// Direct stores keep shared memory for the operand ring (4 stages of a
// 128x256 tile fill 192 KB); while consumers store, the producer is already
// loading the next tile, so the stores overlap with TMA, not with WGMMA.
#pragma once
#include "gemm/elem.h"
#include "gemm/sm90/tile_config.cuh"

namespace kosmos::sm90 {

// Row r of the engine's C: the Problem's row-major [M, N] unless the hooks
// map rows elsewhere (gemm/tile_hooks.h).
template <class OutT, class Cfg, class Hooks>
CUTE_DEVICE OutT* out_row(const Params<Cfg>& p, Hooks& h, gemm::TileCoord t, int r) {
  if constexpr (Hooks::kMapsRows) {
    return h.template row_ptr<OutT>(t, r);
  } else {
    return r < p.M ? static_cast<OutT*>(p.c) + static_cast<size_t>(r) * p.N : nullptr;
  }
}

// thr: this consumer thread's slice of the TiledMma; acc: its accumulators of
// tile t. In a wgmma accumulator fragment, values 2i and 2i+1 are adjacent
// columns of one row, so each thread writes 2-element vectors (a mapped row
// must start 2-element aligned when N is even).
template <class Cfg, class OutT, class Thr, class Acc, class Hooks>
CUTE_DEVICE void store_tile(const Params<Cfg>& p, const Thr& thr, const Acc& acc, gemm::TileCoord t, Hooks& h) {
  Tensor coord = thr.partition_C(make_identity_tensor(Shape<typename Cfg::BM, typename Cfg::BN>{}));
  const int m0 = t.m * Cfg::kBM, n0 = t.n * Cfg::kBN;
  const bool vec = (p.N % 2) == 0;  // rows start 2-element aligned
  // A consumer thread's fragment of a 64xBN wgmma accumulator holds two rows,
  // r and r + 8, alternating every element pair (accumulator index = column
  // pair + 2 * row half + 4 * column group), so each row is mapped once per
  // tile and the unrolled loop picks its pointer by a compile-time index.
  static_assert(decltype(size<1>(acc))::value == 1 && decltype(size<2>(acc))::value == 1,
                "one wgmma atom per consumer warp group and tile");
  OutT* const rows[2] = {out_row<OutT>(p, h, t, m0 + get<0>(coord(0))), out_row<OutT>(p, h, t, m0 + get<0>(coord(2)))};
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    const int c = n0 + get<1>(coord(i));
    OutT* const row = rows[(i >> 1) & 1];
    if (row == nullptr) continue;
    if (vec && c + 1 < p.N) {
      gemm::store_f32x2(row + c, acc(i), acc(i + 1));
    } else {
      const int c1 = n0 + get<1>(coord(i + 1));
      if (c < p.N) gemm::store_f32(row + c, acc(i));
      if (c1 < p.N) gemm::store_f32(row + c1, acc(i + 1));
    }
  }
}

}  // namespace kosmos::sm90
