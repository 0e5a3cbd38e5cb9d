// Static tile orders and the simplest scheduler built on them. Plain
// __host__ __device__ code: the CPU tests can enumerate the same order the
// kernel walks.
#pragma once
#include "gemm/tile_problem.h"

namespace kosmos::gemm {

// L2-friendly order: tiles are walked in bands of `group` tile-rows; inside a
// band, column by column. Concurrently running CTAs then share a few A row
// bands and a few B column bands instead of streaming all of B per row band.
struct SwizzledOrder {
  int tiles_m, tiles_n, group;

  KOSMOS_HD int count() const { return tiles_m * tiles_n; }

  KOSMOS_HD TileCoord at(int t) const {
    const int per_band = group * tiles_n;
    const int band = t / per_band, in_band = t % per_band;
    const int m0 = band * group;
    const int rows = (tiles_m - m0) < group ? (tiles_m - m0) : group;  // last band may be short
    return TileCoord{m0 + in_band % rows, in_band / rows};
  }
};

// Tile-rows per band for `grid` CTAs running tiles of bm x bn at once. A wave
// of g tile-rows by grid/g tile-columns reads g*bm rows of A and (grid/g)*bn
// rows of B per k-block from DRAM (each is read once and shared through L2),
// least at g = sqrt(grid * bn / bm): 16 for 128x256 tiles on 132 SMs, ~21%
// less than at 8 by this count (ncu, 2026-12-01, 70B-FC1-MBS1: group 8 read
// 1.32 GB from DRAM, cuBLAS's kernel 1.05 GB). Capped at the problem's tile-rows.
KOSMOS_HD inline int swizzle_group(int tiles_m, int grid, int bm, int bn) {
  int g = 1;
  while ((long long)(g + 1) * (g + 1) * bm <= (long long)grid * bn) ++g;
  return g < tiles_m ? g : (tiles_m > 0 ? tiles_m : 1);
}

// Persistent-CTA static schedule: CTA b takes tiles b, b + grid, b + 2 grid ...
// of the swizzled order. Called by the one thread that claims for its CTA; the
// engines broadcast each claim to the rest of the CTA through shared memory.
struct StaticScheduler {
  SwizzledOrder order;
  int next_t, stride;

  KOSMOS_HD StaticScheduler(SwizzledOrder o, int first, int step) : order(o), next_t(first), stride(step) {}

  KOSMOS_HD bool next(TileCoord& t) {
    if (next_t >= order.count()) return false;
    t = order.at(next_t);
    next_t += stride;
    return true;
  }
};

}  // namespace kosmos::gemm
