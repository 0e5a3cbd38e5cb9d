// Epilogue of the Hopper engine: fp32 accumulators rounded once to the output
// type (bf16 for a finished product, fp32 for partials another pass reduces).
//
// Two ways out. With Cfg::kSmemEpilogue (16-bit outputs) the consumers stage
// the tile in shared memory and it leaves asynchronously while the tensor
// cores compute the next tile: as kBN / 64 TMA stores of swizzled boxes issued
// by one thread (store_boxes: the standalone GEMM, GEMM+RS), or, where hooks
// map rows one by one (AG+GEMM's gathered output), from a padded buffer with
// one bulk copy per row (copy_out_row, bulk_store.cuh). One copy per row cost
// ~2.4 us of issue per 128x256 tile against ~0.8 us for the boxes (trace
// spans, loopback GEMM+RS, 2026-12-01). Storing straight from registers
// instead (store_tile: fp32 outputs, or N not a multiple of 8) leaves the
// tensor cores idle for the whole store, and its 4-byte stores fill only half
// of every 32-byte sector they touch (with it our GEMM ran at 0.58-0.90x
// cuBLAS at K = 512 and 0.89-0.93x at K = 6656: benchmarks/RESULTS.md).
#pragma once
#include <type_traits>

#include "gemm/elem.h"
#include "gemm/sm90/bulk_store.cuh"
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

// The staged-tile path needs every output row to be whole 16-byte runs.
template <class Cfg>
CUTE_DEVICE bool smem_epilogue(const Params<Cfg>& p) {
  if constexpr (Cfg::kSmemEpilogue) {
    return p.N % 8 == 0;
  } else {
    return false;
  }
}

// Byte offset in s.c of staged element (r, c) (c even), in either layout:
// kBoxes, the TMA store's kBN / 64 boxes of [kBM][64], 128 bytes a row, whose
// 16-byte chunk j of row r sits at chunk j ^ (r % 8) (the 128-byte swizzle,
// Cfg::OutBox; the buffer is 1024-byte aligned); else rows of kEpiPitch.
template <class Cfg, bool kBoxes>
CUTE_HOST_DEVICE uint32_t staged_offset(int r, int c) {
  if constexpr (kBoxes) {
    return uint32_t((c / Cfg::kOutBoxCols) * Cfg::kOutBoxBytes + r * 128 + ((((c / 8) % 8) ^ (r % 8)) * 16) +
                    (c % 8) * 2);
  } else {
    return uint32_t((r * Cfg::kEpiPitch + c) * 2);
  }
}

// stmatrix addressing (stage_tile). A warp's fragment rows start at rw (a
// multiple of 16); step q of its stores writes accumulator column groups 2q and
// 2q + 1 (8 columns each) of both row halves as four 8x8 matrices, and lane l
// names one matrix row: row rw + l % 16 at column 8 * (2q + l / 16). Its byte
// offset in s.c is a per-lane base (stmatrix_lane_offset) moved by a step that
// is compile-time in q (stmatrix_offset): under the swizzle, column group
// 2q + l / 16 of row r sits in chunk (2q % 8) ^ (l / 16) ^ (r % 8) of box q / 4,
// and XORing the 1024-byte-aligned base's chunk bits with (2q % 8) moves it
// there (tests/host/sm90_staged_layout.cu checks both against staged_offset).
template <class Cfg, bool kBoxes>
CUTE_HOST_DEVICE uint32_t stmatrix_lane_offset(int rw, int lane) {
  return staged_offset<Cfg, kBoxes>(rw + lane % 16, 8 * (lane / 16));
}
template <class Cfg, bool kBoxes>
CUTE_HOST_DEVICE uint32_t stmatrix_offset(uint32_t lane_at, int q) {
  if constexpr (kBoxes) {
    return (lane_at ^ uint32_t((2 * q % 8) * 16)) + uint32_t((q / 4) * Cfg::kOutBoxBytes);
  } else {
    return lane_at + uint32_t(32 * q);
  }
}

CUTE_DEVICE uint32_t pack_bf16x2(float v0, float v1) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

// The bf16x2 sum of two packed pairs, each half correctly rounded (see
// combine_pair for why that is the two-term fp32 sum rounded once).
CUTE_DEVICE uint32_t add_bf16x2(uint32_t a, uint32_t b) {
  __nv_bfloat162 ha, hb;
  memcpy(&ha, &a, 4);
  memcpy(&hb, &b, 4);
  const __nv_bfloat162 h = __hadd2(ha, hb);
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

// Four 8x8 bf16 matrices from the warp's registers: lane l's register j holds
// row l / 4, columns 2 * (l % 4) and + 1 of matrix j (the wgmma accumulator
// fragment's own order), and lanes 8j..8j+7 name the rows of matrix j.
CUTE_DEVICE void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// stmatrix_x4's inverse: the same addresses give the same registers.
CUTE_DEVICE void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Consumer threads: tile accumulators -> the staged tile s.c, rounded to bf16.
// A thread's fragment of a 64xBN wgmma accumulator holds rows r and r + 8 of
// its warp's 16 (accumulator index = column pair + 2 * row half + 4 * column
// group, the host test checks this against the TiledMma), so eight
// consecutive accumulators are four whole 8x8 matrices: one stmatrix each,
// BN / 16 per thread instead of BN / 2 four-byte stores. Either layout keeps
// the eight rows of a matrix on disjoint banks (the pitch's padding, or the
// swizzle). kAddStaged: s.c already holds another bf16 tile of the same layout
// (a combine term the fold prefetched, tp/rs_fold_sm90.cuh), and each element
// becomes the two-term sum (add_bf16x2): ldmatrix reads it back in the
// fragment's own order, so the sum costs one shared load per store.
template <class Cfg, class OutT, bool kBoxes, bool kAddStaged = false, class Thr, class Acc>
CUTE_DEVICE void stage_tile(SharedStorage<Cfg>& s, const Thr& thr, const Acc& acc) {
  static_assert(std::is_same_v<OutT, gemm::bf16>, "the staged epilogue holds bf16; fp32 needs SmemEpi = false");
  static_assert(decltype(size(acc))::value == Cfg::kBN / 2, "one 64xBN wgmma accumulator per consumer thread");
  Tensor coord = thr.partition_C(make_identity_tensor(Shape<typename Cfg::BM, typename Cfg::BN>{}));
  const int rw = get<0>(coord(0)) & ~15;  // the warp's first row
  // 32-bit shared addresses: generic 64-bit pointers here cost ptxas ~60
  // registers it did not have beside the accumulators (spills).
  const uint32_t lane_at = smem_u32(s.c) + stmatrix_lane_offset<Cfg, kBoxes>(rw, int(threadIdx.x % 32));
  // kAddStaged reads kAddBatch steps' matrices before it adds and stores them:
  // one shared-memory round trip per batch, not per step (each asm is volatile
  // with a memory clobber, so they keep their order).
  constexpr int kSteps = Cfg::kBN / 16, kAddBatch = 4;
  static_assert(kSteps % kAddBatch == 0, "whole batches of steps");
  CUTE_UNROLL
  for (int q0 = 0; q0 < kSteps; q0 += kAddBatch) {
    uint32_t other[kAddBatch][4];
    if constexpr (kAddStaged) {
      CUTE_UNROLL
      for (int u = 0; u < kAddBatch; ++u) ldmatrix_x4(stmatrix_offset<Cfg, kBoxes>(lane_at, q0 + u), other[u]);
    }
    CUTE_UNROLL
    for (int u = 0; u < kAddBatch; ++u) {
      const int q = q0 + u;
      uint32_t r[4];
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) {
        r[j] = pack_bf16x2(acc(8 * q + 2 * j), acc(8 * q + 2 * j + 1));
        if constexpr (kAddStaged) r[j] = add_bf16x2(r[j], other[u][j]);
      }
      stmatrix_x4(stmatrix_offset<Cfg, kBoxes>(lane_at, q), r);
    }
  }
}

// Where a staged tile leaves by TMA store: `map` (in parameter space) over a
// row-major bf16 [rows, cols] matrix, at its tile row `tile_row` (in kBM rows)
// and from column col0 (a multiple of 64); what lies past the matrix is clipped.
template <class TmaC>
struct StoreBox {
  const TmaC* map;
  int rows, cols, tile_row, col0;
};

// One consumer thread: issues the TMA stores of the staged boxes (kBoxes
// layout, made visible to the async proxy and complete before this) in this
// thread's bulk group; the caller commits it. kCols: the staged columns
// stored, kCols / 64 boxes from staged box `first`.
template <class Cfg, int kCols = Cfg::kBN, class TmaC>
CUTE_DEVICE void store_boxes(SharedStorage<Cfg>& s, const StoreBox<TmaC>& b, int first = 0) {
  static_assert(kCols % Cfg::kOutBoxCols == 0 && kCols <= Cfg::kBN, "whole boxes of the staged tile");
  using Box = Shape<typename Cfg::BM, Int<Cfg::kOutBoxCols>>;
  Tensor g = local_tile(b.map->get_tma_tensor(make_shape(b.rows, b.cols)), Box{}, make_coord(b.tile_row, _));
  Tensor sc = make_tensor(make_smem_ptr(reinterpret_cast<bf16*>(s.c)), typename Cfg::OutTile{});  // (kBM, 64, box)
  auto [tg, ts] = tma_partition(*b.map, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sc), group_modes<0, 2>(g));
  CUTE_UNROLL
  for (int j = 0; j < kCols / Cfg::kOutBoxCols; ++j) copy(*b.map, ts(_, first + j), tg(_, b.col0 / Cfg::kOutBoxCols + j));
}

// One consumer thread per row (row < kBM): copies staged row `row` of tile t to
// where the hooks map it, clipped to N; rows past the problem are skipped.
// Both ends are 16-byte aligned: N % 8 == 0 (smem_epilogue) and 16-byte
// aligned bases (unsupported(), the fused launchers).
template <class Cfg, class OutT, class Hooks>
CUTE_DEVICE void copy_out_row(const Params<Cfg>& p, SharedStorage<Cfg>& s, Hooks& h, gemm::TileCoord t, int row) {
  OutT* const dst = out_row<OutT>(p, h, t, t.m * Cfg::kBM + row);
  if (dst == nullptr) return;
  const int n0 = t.n * Cfg::kBN;
  const int cols = p.N - n0 < Cfg::kBN ? p.N - n0 : Cfg::kBN;
  bulk_store(dst + n0, reinterpret_cast<const OutT*>(s.c) + row * Cfg::kEpiPitch, cols * (uint32_t)sizeof(OutT));
}

}  // namespace kosmos::sm90
