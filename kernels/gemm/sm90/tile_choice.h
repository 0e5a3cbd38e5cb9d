// Which problems the Hopper engine takes, and which tile shape to use for one
// (a closed-form wave model). Plain C++ (no CuTe) so the host launcher, an FFI
// handler and CPU tests share it.
//
// A persistent grid runs ceil(tiles / grid) waves. A wave of narrower tiles
// does less work and runs at a lower efficiency, but wastes less of the last
// wave where there are few tiles (8B-QKV: 96 tiles of 128x256 on 132 SMs).
#pragma once
#include "gemm/tile_problem.h"

namespace kosmos::sm90 {

enum class TileShape : int { k128x256 = 0, k128x128 = 1, k128x192 = 2 };
constexpr int kTileShapes = 3;

constexpr int tile_n(TileShape t) { return t == TileShape::k128x128 ? 128 : t == TileShape::k128x192 ? 192 : 256; }

inline const char* tile_name(TileShape t) {
  switch (t) {
    case TileShape::k128x256: return "128x256";
    case TileShape::k128x128: return "128x128";
    case TileShape::k128x192: return "128x192";
  }
  return "?";
}

// Throughput of each shape's full waves relative to 128x256 (work per wave /
// time), indexed by TileShape: fitted to all 72 paper shapes on H200
// (2026-12-01, benchmarks/gemm_standalone, benchmarks/RESULTS.md), where it
// picks the fastest measured shape to within 1% geomean per layout.
constexpr double kWaveEfficiency[kTileShapes] = {1.0, 0.84, 0.94};

// Predicted time of a problem on `grid` CTAs, in units of one 128x256 wave:
// ceil(tiles / grid) waves, each costing its tile area over its efficiency.
inline double predicted_waves(TileShape t, int M, int N, int grid) {
  const long tiles = (long)gemm::ceil_div(M, 128) * gemm::ceil_div(N, tile_n(t));
  const long waves = (tiles + grid - 1) / grid;
  return waves * (tile_n(t) / 256.0) / kWaveEfficiency[(int)t];
}

// The shape of least predicted time (ties: the wider tile).
inline TileShape choose_tile(int M, int N, int grid) {
  TileShape best = TileShape::k128x256;
  for (TileShape t : {TileShape::k128x192, TileShape::k128x128})
    if (predicted_waves(t, M, N, grid) < predicted_waves(best, M, N, grid)) best = t;
  return best;
}

// How kosmos_matmul covers a problem: one launch of `head` over every row
// (head_rows >= M), or `head` over rows [0, head_rows) and then `tail`, a
// narrower tile, over the rest. The second launch replaces a last wave that
// would run mostly idle (70B-QKV: 320 tiles of 128x256 are 2.4 waves on 132
// SMs) by a full wave of smaller tiles; every output tile still has one
// completion point (no split-K, no stream-K).
struct Plan {
  TileShape head, tail;
  int head_rows;  // a multiple of 128, or >= M for one launch
  int group = 0;  // tile-rows per swizzle band (gemm/tile_order.h); 0: swizzle_group's rule
};

// Cost of the second launch in time (a launch behind a drained one on the
// same stream; a guess, not measured alone), and the time of one 128x256
// k-block on one SM at ~700 TF/s over 132 SMs, which converts it into waves.
constexpr double kSecondLaunchUs = 4.0;
constexpr double kKBlockUs = 0.79;
// A split must be predicted this much faster than the single launch: on the
// 72 paper shapes (H200, 2026-12-01) the splits predicted >= 8% faster were
// 3-7% faster (70B-QKV, 8B-Down-MBS1); those predicted 0-4% faster measured
// -6%..+2%, i.e. noise or worse.
constexpr double kSplitMinGain = 1.05;

inline Plan single(TileShape t, int M) { return Plan{t, t, M}; }

// The plan of least predicted time: choose_tile's single launch, or a head of
// whole waves of 128x256 or 128x192 tiles and a tail of narrower ones, where
// that is predicted kSplitMinGain faster.
inline Plan plan_gemm(int M, int N, int K, int grid) {
  const Plan one = single(choose_tile(M, N, grid), M);
  const double one_cost = predicted_waves(one.head, M, N, grid);
  Plan best = one;
  double best_cost = one_cost;
  const double gap = kSecondLaunchUs / (kKBlockUs * gemm::ceil_div(K, 64));  // in 128x256 waves
  const int rows = gemm::ceil_div(M, 128);
  for (TileShape h : {TileShape::k128x256, TileShape::k128x192}) {
    const int cols = gemm::ceil_div(N, tile_n(h));
    const long waves = (long)rows * cols / grid;  // whole waves of head tiles
    const int head = cols <= grid ? (int)(waves * grid / cols) : 0;  // tile rows that fill them
    if (waves < 1 || head <= 0 || head >= rows) continue;
    for (TileShape t : {TileShape::k128x192, TileShape::k128x128}) {
      if (tile_n(t) >= tile_n(h)) continue;
      const double cost =
          predicted_waves(h, head * 128, N, grid) + predicted_waves(t, M - head * 128, N, grid) + gap;
      if (cost < best_cost) best = Plan{h, t, head * 128}, best_cost = cost;
    }
  }
  return best_cost * kSplitMinGain <= one_cost ? best : one;
}

// Why a problem cannot run on this engine, or nullptr. TMA needs 16-byte
// aligned bases and leading dimensions that are multiples of 16 bytes; the
// caller falls back to the portable engine otherwise.
inline const char* unsupported(const gemm::Problem& p, gemm::Layout l) {
  auto misaligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) != 0; };
  if (p.M <= 0 || p.N <= 0 || p.K <= 0) return "empty problem";
  if (misaligned(p.a) || misaligned(p.b) || misaligned(p.c)) return "operand not 16-byte aligned";
  const int lda = gemm::leading_dim_a(l, p);
  const int ldb = gemm::major_b(l) == gemm::Major::K ? p.K : p.N;
  if (lda % 8 || ldb % 8) return "leading dimension not a multiple of 8 elements";
  return nullptr;
}

}  // namespace kosmos::sm90
