// Role policy, plain host/device code so the CPU emulation runs the same rules.
// Movers transport, builders compute tiles. AG+GEMM switches one way: a mover
// whose queue is empty becomes a builder for the rest of the kernel.
#pragma once

#include "kosmos/platform.h"

namespace kosmos {

enum class Role : int { kMover = 0, kBuilder = 1 };

// The first `movers` CTAs start as movers, the rest as builders. movers may be 0
// (builders then move whatever they need themselves) or the whole grid.
KOSMOS_HD inline Role initial_role(int cta, int grid, int movers) {
  (void)grid;
  return cta < movers ? Role::kMover : Role::kBuilder;
}

// One-way switching (paper §3.1): once a mover finds its queue empty it builds;
// a builder never returns to moving except to help with an unclaimed input.
KOSMOS_HD inline Role one_way_after_empty(Role r) {
  (void)r;
  return Role::kBuilder;
}

// Movers a grid gets when the caller does not choose: none with no peers;
// otherwise about one in eight CTAs (at least 1, leaving at least one builder).
KOSMOS_HD inline int default_movers(int grid, int tp) {
  if (tp <= 1 || grid <= 1) return 0;
  int m = grid / 8;
  if (m < 1) m = 1;
  if (m > grid - 1) m = grid - 1;
  return m;
}

}  // namespace kosmos
