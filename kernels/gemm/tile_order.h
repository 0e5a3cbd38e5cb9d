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
