// Tile math of the combining epilogue (GEMM+RS's fold, tp/rs_fold_sm90.cuh):
// a staged bf16 tile summed in fp32 with other ranks' partial tiles, rounded
// once, and the TMA load that brings a partial into the staged buffer under the
// mainloop. The engine knows none of it: the fold's staging type calls these.
#pragma once
#include "gemm/sm90/epilogue.cuh"

namespace kosmos::sm90 {
// 16 staged bytes (8 bf16) at shared address `addr`, and back.
CUTE_DEVICE uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
CUTE_DEVICE void st_shared_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// combine_tile with two terms: the staged one and `peer` (this thread's first
// vector; the next kPerThread - 1 are kThreads vectors apart). Their fp32 sum
// is the two-term sum in either order (-0.0 + x == x, and an IEEE add
// commutes), so the pass may issue every load of the peer first: one round
// trip instead of one per batch. And it may add in bf16x2 (one instruction per
// pair, not two widenings, an add and a rounding): the fp32 sum of two bf16
// values is exact unless their exponents are over 15 apart, and then the
// smaller is far below half a bf16 ulp of the larger, so rounding it to bf16
// is the correctly rounded bf16 sum either way (signed zeros alike).
template <int kPerThread, int kThreads>
CUTE_DEVICE void combine_pair(uint32_t staged0, uint32_t staged_step, const uint4* peer) {
  uint4 raw[kPerThread];
  CUTE_UNROLL
  for (int u = 0; u < kPerThread; ++u) raw[u] = __ldcg(peer + u * kThreads);
  CUTE_UNROLL
  for (int u = 0; u < kPerThread; ++u) {
    const uint32_t at = staged0 + u * staged_step;
    const uint4 mine = ld_shared_v4(at);
    st_shared_v4(at, make_uint4(add_bf16x2(mine.x, raw[u].x), add_bf16x2(mine.y, raw[u].y),
                                add_bf16x2(mine.z, raw[u].z), add_bf16x2(mine.w, raw[u].w)));
  }
}

// Consumers, after stage_tile and a barrier: the staged tile s.c becomes the
// sum of n bf16 tiles in fp32, in the order 0..n-1, rounded once. Term `own`
// is the staged tile itself; the others are src(term), [kBM][kBN] in global
// memory, written by other CTAs or GPUs during this launch and acquired before
// (their writers released them after their copies completed; the barrier hands
// thread 0's acquire to every thread, and the loads bypass L1, as the
// reducers' do). The sum starts from -0.0f, which adds to any x as x (from
// 0.0f, -0.0 would become +0.0), so it equals a sum started from term 0 and the
// reducers' sum bitwise.
//
// The accumulators are dead here, so the pass is cooperative in 16-byte
// vectors: each warp takes whole rows (coalesced 512-byte reads of a source
// tile, conflict-free ones of the staged row) with kBatch vectors of a term in
// flight per thread. Each thread rewrites only the vectors it read, so the pass
// needs no barrier of its own. Measured per 128x256 tile at TP 2 (trace spans,
// loopback, 2026-12-01): the first version, which summed into the fragment
// (4-byte loads at its positions beside 128 live accumulators, ~8 in flight),
// took ~6.8 us; batches of 4 vectors in flight ~5.9 us (an L2 prefetch of the
// source changed nothing); every vector in flight and bf16x2 adds
// (combine_pair, TP 2) ~3.5 us, still most of a K = 512 mainloop (~5 us).
template <class Cfg, bool kBoxes, class Src>
CUTE_DEVICE void combine_tile(SharedStorage<Cfg>& s, int ctid, int n, int own, const Src& src) {
  constexpr int kVec = 8;                              // bf16 per 16-byte vector
  constexpr int kPerRow = Cfg::kBN / kVec;             // vectors per tile row
  constexpr int kThreads = 128 * Cfg::kConsumerWGs;
  constexpr int kPerThread = Cfg::kBM * kPerRow / kThreads;
  constexpr int kBatch = kPerThread < 4 ? kPerThread : 4;  // 8: ptxas spilled ~430 B more
  static_assert(Cfg::kBN % kVec == 0 && (Cfg::kBM * kPerRow) % (kThreads * kBatch) == 0, "whole batches per thread");
  static_assert(kThreads % kPerRow == 0, "a thread's vectors share one column");
  constexpr int kRowStep = kThreads / kPerRow;  // rows between a thread's vectors
  static_assert(!kBoxes || kRowStep % 8 == 0, "a thread's rows share one swizzle phase (r % 8)");
  // Vector k of this thread: row ctid / kPerRow + k * kRowStep, its column fixed.
  const uint32_t staged0 = smem_u32(s.c) + staged_offset<Cfg, kBoxes>(ctid / kPerRow, (ctid % kPerRow) * kVec);
  constexpr uint32_t kStagedStep = kRowStep * (kBoxes ? 128 : Cfg::kEpiPitch * 2);  // bytes
  if (n == 2) {  // uniform: one source, all of this thread's vectors of it in flight at once
    combine_pair<kPerThread, kThreads>(staged0, kStagedStep, reinterpret_cast<const uint4*>(src(1 - own)) + ctid);
    return;
  }
  CUTE_UNROLL
  for (int b0 = 0; b0 < kPerThread; b0 += kBatch) {
    float acc[kBatch][kVec];
    CUTE_UNROLL
    for (int u = 0; u < kBatch; ++u)
      CUTE_UNROLL
      for (int e = 0; e < kVec; ++e) acc[u][e] = -0.0f;
    for (int term = 0; term < n; ++term) {
      uint4 raw[kBatch];
      if (term == own) {  // uniform across the CTA
        CUTE_UNROLL
        for (int u = 0; u < kBatch; ++u) raw[u] = ld_shared_v4(staged0 + (b0 + u) * kStagedStep);
      } else {
        const uint4* g = reinterpret_cast<const uint4*>(src(term)) + ctid;  // [kBM][kPerRow] vectors
        CUTE_UNROLL
        for (int u = 0; u < kBatch; ++u) raw[u] = __ldcg(g + (b0 + u) * kThreads);
      }
      CUTE_UNROLL
      for (int u = 0; u < kBatch; ++u) {
        const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw[u]);
        CUTE_UNROLL
        for (int e = 0; e < kVec / 2; ++e) {
          const float2 f = __bfloat1622float2(h[e]);
          acc[u][2 * e] += f.x, acc[u][2 * e + 1] += f.y;
        }
      }
    }
    CUTE_UNROLL
    for (int u = 0; u < kBatch; ++u) {
      uint32_t packed[kVec / 2];
      CUTE_UNROLL
      for (int e = 0; e < kVec / 2; ++e) packed[e] = pack_bf16x2(acc[u][2 * e], acc[u][2 * e + 1]);
      st_shared_v4(staged0 + (b0 + u) * kStagedStep, make_uint4(packed[0], packed[1], packed[2], packed[3]));
    }
  }
}

// Where a bf16 [kBM][kBN] tile is TMA-loaded from into the staged buffer:
// `desc`, a CUtensorMap over a row-major bf16 matrix whose box is Cfg::OutBox
// with the 128-byte swizzle (a make_output_tma descriptor: a tensor map names
// no direction), in parameter, constant or global memory; the tile's first
// row and column (a multiple of 64) in it. TMA counts a box's out-of-bounds
// elements too (zero-filled), so every load lands kBM * kBN * 2 bytes.
struct LoadBox {
  const void* desc;
  int row0, col0;
};

// One thread: the kBN / 64 boxes of b into s.c (the kBoxes layout, the one
// store_boxes reads, so the tile lands where stage_tile puts its own), each
// completing on `bar`, whose expected bytes the caller has announced.
template <class Cfg>
CUTE_DEVICE void load_boxes(SharedStorage<Cfg>& s, const LoadBox& b, uint64_t* bar) {
  constexpr uint64_t kEvictNormal = static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_NORMAL);
  CUTE_UNROLL
  for (int j = 0; j < Cfg::kBN / Cfg::kOutBoxCols; ++j)
    SM90_TMA_LOAD_2D::copy(b.desc, bar, kEvictNormal,
                           reinterpret_cast<char*>(s.c) + staged_offset<Cfg, true>(0, j * Cfg::kOutBoxCols),
                           b.col0 + j * Cfg::kOutBoxCols, b.row0);
}

}  // namespace kosmos::sm90
