// Host check of the static tile orders (kernels/gemm/tile_order.h) that the
// Hopper GEMM walks: for many grids, every tile is claimed exactly once, and
// with 2-CTA clusters (ClusterRowScheduler) both CTAs of a cluster claim the
// same number of tiles, in lockstep, in one tile column and adjacent tile rows
// (what the B multicast needs); the only extra claims are rows past the end.
// Usage: tile_order_check  (exit 0 = all passed; prints "N failures")
#include <cstdio>
#include <vector>

#include "gemm/tile_order.h"

using namespace kosmos::gemm;

namespace {

int failures = 0;

void fail(const char* what, int tm, int tn, int group, int size, int clusters) {
  if (++failures <= 20)
    std::printf("FAIL %s: tiles %dx%d group %d cluster %d clusters %d\n", what, tm, tn, group, size, clusters);
}

std::vector<TileCoord> claims(int tm, int tn, int group, int size, int clusters, int cluster, int rank) {
  const int rows = (tm + size - 1) / size;
  ClusterRowScheduler s{StaticScheduler(SwizzledOrder{rows, tn, group}, cluster, clusters), size, rank};
  std::vector<TileCoord> out;
  for (TileCoord t{0, 0}; s.next(t);) out.push_back(t);
  return out;
}

void check(int tm, int tn, int group, int size, int clusters) {
  std::vector<int> seen(tm * tn, 0);
  const int padded = (tm + size - 1) / size * size;
  for (int c = 0; c < clusters; ++c) {
    std::vector<std::vector<TileCoord>> cta(size);
    for (int r = 0; r < size; ++r) cta[r] = claims(tm, tn, group, size, clusters, c, r);
    for (int r = 0; r < size; ++r) {
      if (cta[r].size() != cta[0].size()) fail("cluster CTAs claim different counts", tm, tn, group, size, clusters);
      for (size_t i = 0; i < cta[r].size() && i < cta[0].size(); ++i) {
        const TileCoord t = cta[r][i], t0 = cta[0][i];
        if (t.n != t0.n || t.m != t0.m + r || t.m % size != r) fail("cluster CTAs out of lockstep", tm, tn, group, size, clusters);
        if (t.m >= padded || t.n >= tn) fail("claim outside the padded grid", tm, tn, group, size, clusters);
        if (t.m < tm && t.n < tn) ++seen[t.m * tn + t.n];
      }
    }
  }
  for (int v : seen)
    if (v != 1) {
      fail("a tile not claimed exactly once", tm, tn, group, size, clusters);
      break;
    }
}

}  // namespace

int main() {
  int cases = 0;
  for (int size : {1, 2})
    for (int tm = 1; tm <= 11; ++tm)
      for (int tn = 1; tn <= 6; ++tn)
        for (int group : {1, 2, 4})
          for (int clusters = 1; clusters <= 7; ++clusters, ++cases) check(tm, tn, group, size, clusters);
  std::printf("%d cases, %d failures\n", cases, failures);
  return failures == 0 ? 0 : 1;
}
