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
  return t == TileShape::k128x256 ? "128x256" : t == TileShape::k128x128 ? "128x128" : "128x192";
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

// Why a problem cannot run on this engine, or nullptr. TMA needs 16-byte
// aligned bases and leading dimensions that are multiples of 16 bytes; the
// caller falls back to the portable engine otherwise.
inline const char* unsupported(const gemm::Problem& p, gemm::Layout l) {
  auto misaligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) != 0; };
  if (p.M <= 0 || p.N <= 0 || p.K <= 0) return "empty problem";
  if (misaligned(p.a) || misaligned(p.b) || misaligned(p.c)) return "operand not 16-byte aligned";
  const int lda = gemm::major_a(l) == gemm::Major::K ? p.K : p.M;
  const int ldb = gemm::major_b(l) == gemm::Major::K ? p.K : p.N;
  if (lda % 8 || ldb % 8) return "leading dimension not a multiple of 8 elements";
  return nullptr;
}

}  // namespace kosmos::sm90
