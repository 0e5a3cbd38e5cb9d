// Role policy, plain host/device code so the CPU emulation runs the same rules.
// Movers transport, builders compute tiles. AG+GEMM switches one way: a mover
// whose queue is empty becomes a builder for the rest of the kernel (tp/ag_sched.h
// ag_cta); builders never move.
#pragma once

#include "kosmos/platform.h"

namespace kosmos {

enum class Role : int { kMover = 0, kBuilder = 1 };

// The first `movers` CTAs start as movers, the rest as builders. movers may be
// the whole grid; with peers the launchers keep it >= 1 (builders never move).
KOSMOS_HD inline Role initial_role(int cta, int grid, int movers) {
  (void)grid;
  return cta < movers ? Role::kMover : Role::kBuilder;
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

namespace kosmos {

// ---- GEMM+RS (paper §3.2.2; tp/rs_sched.h) ------------------------------------
// Switching runs the other way: builders become reducers once the GEMM queue is
// empty. The reducer plays the paper's mover role (it pulls and sums bands), so
// it is Role::kMover here.

// The first `reducers` CTAs start as reducers, clamped so at least one CTA starts
// as a builder: with one CTA it builds every tile before reducing. Correctness
// rests on the clamp: reducers never build, they wait for the builders' claims
// (tp/rs_sched.h rs_cta). A builder whose GEMM queue is empty reduces (one way).
KOSMOS_HD inline Role rs_initial_role(int cta, int grid, int reducers) {
  const int r = reducers < grid - 1 ? reducers : grid - 1;
  return cta < r ? Role::kMover : Role::kBuilder;
}

// Reducers a grid starts with when the caller does not choose: the AG mover
// heuristic (none without peers, about one in eight CTAs); builders join later.
KOSMOS_HD inline int rs_default_reducers(int grid, int tp) { return default_movers(grid, tp); }

}  // namespace kosmos
