// Where the MoE forward's rows live (paper §3.3.1; the schedule is
// moe/fwd_sched.h): the shape, the receive arena and its two sizes, and the
// layout that the count exchange determines, plain host/device code.
// One rank of an EP group of `ep` ranks owns E_l = e_local experts (expert e
// lives on rank e / E_l as local expert e % E_l); every rank has t tokens in
// nb token blocks of B (plan.h's blocks).
//
// Receive arena (rank d): expert-major, source-minor, rows packed by the
// exchanged counts, each expert's segment padded to tile_m rows so that no row
// block straddles experts; padding rows are computed and never read (a GEMM
// output row depends on its own input row only). Return buffer (rank s): t*k
// rows in s's packed send order (plan_segments<1>), so pair p's row is
// start1[e] + pos[p] and a unit lands as one contiguous range.
// Capacity: the arena is sized by C rows per (source, expert),
// E_l * roundup(ep*C, tile_m) rows; the packed layout fits whenever no count
// exceeds C (an expert then has at most ep*C rows). The layout item tests the
// whole exchanged table (plan_overflow), so every rank sees the same answer; on
// overflow the call runs dropless: the same queues over the same count-driven
// layout, placed in the dropless arena of moe_arena_rows(s, true) rows, which
// grows with tokens x k (a token picks an expert once, so a source sends a rank
// at most t * min(k, E_l) rows), not experts x tokens. Never a silent drop.
#pragma once

#include "kosmos/platform.h"
#include "moe/plan.h"
#include "moe/route.h"

namespace kosmos::moe {

constexpr int kEpMaxRanks = 8;  // an EP group: the GPUs of one host

struct MoeFwdShape {
  int ep, rank;
  int tokens;        // t, on every rank
  int top_k;         // k
  int block_tokens;  // B: tokens per route, plan and fold block
  int e_local;       // E_l: experts per rank
  int tile_m;        // rows per GEMM row block; expert segments are padded to it
  int nt1, nt2;      // column blocks of GEMM1 (SwiGLU pairs of 2I) and GEMM2 (of H), per tile engine
  int groups;        // G: dispatch parts per (source, expert), whole plan blocks each
  int capacity;      // C: rows per (source, expert) of the capped arena
  // The shared expert (every token, weight 1, as wide as a routed one), when
  // shared_blocks > 0: its rows are row blocks [shared_rb0, + shared_blocks),
  // tokens [tile_m * i, + tile_m) in row block shared_rb0 + i, past every
  // arena row block the layout can use (shared_blocks = ceil(t / tile_m)).
  int shared_rb0, shared_blocks;
  int band;          // row blocks per band of the build queue's tile order (moe/fwd_queues.h)
  // The backward at EP > 1: the move queue also pushes each pair's forward input
  // row (the X rows wgrad1 contracts) into its owner's X arena, after every dY
  // part (moe/fwd_queues.h moe_move_item). At EP = 1 the forward's arena is kept.
  int x_parts = 0;
};

KOSMOS_HD inline int moe_cdiv(int a, int b) { return (a + b - 1) / b; }
KOSMOS_HD inline int moe_experts(const MoeFwdShape& s) { return s.ep * s.e_local; }
KOSMOS_HD inline PlanShape moe_plan_shape(const MoeFwdShape& s) {
  return {s.tokens, s.top_k, s.block_tokens, moe_experts(s)};
}
KOSMOS_HD inline int moe_blocks(const MoeFwdShape& s) { return plan_blocks(moe_plan_shape(s)); }

KOSMOS_HD inline bool moe_fwd_shape_ok(const MoeFwdShape& s) {
  return s.ep >= 1 && s.ep <= kEpMaxRanks && s.rank >= 0 && s.rank < s.ep && s.e_local >= 1 &&
         moe_experts(s) <= kMaxExperts && s.tokens >= 1 && s.top_k >= 1 && s.top_k <= moe_experts(s) &&
         s.block_tokens >= 1 && s.tile_m >= 1 && s.nt1 >= 1 && s.nt2 >= 1 && s.groups >= 1 && s.capacity >= 0 &&
         s.shared_rb0 >= 0 && (s.shared_blocks == 0 || s.shared_blocks == moe_cdiv(s.tokens, s.tile_m)) &&
         s.band >= 1 && (s.x_parts == 0 || s.ep > 1);  // X parts: into peers' heaps, EP > 1 only
}

// What the CTA life needs of a problem whatever the engine or direction
// (the gather's and the fold's 16-byte rows, the layout's experts, the fold's
// 32 lanes per token): "" or why not. Each engine adds its tiles' needs.
inline const char* moe_cta_unsupported(int H, int E, int k) {
  if (H <= 0 || H % 8) return "hidden must be a positive multiple of 8 (the gather's and the fold's 16-byte rows)";
  if (E < 1 || E > kMaxExperts) return "num_experts must be in [1, 512]";
  if (k < 1 || k > 32 || k > E) return "top_k must be in [1, min(32, num_experts)] (the fold's 32 lanes hold a token's rows)";
  return "";
}

// Rows of one rank's receive arena in either mode (see the header).
KOSMOS_HD inline int moe_arena_rows(const MoeFwdShape& s, bool dropless) {
  if (!dropless) return s.e_local * moe_cdiv(s.ep * s.capacity, s.tile_m) * s.tile_m;
  const int per_src = s.tokens * (s.top_k < s.e_local ? s.top_k : s.e_local);
  return s.ep * per_src + s.e_local * (s.tile_m - 1);
}
// Row blocks (and GEMM1/GEMM2 row-block flags) a rank may need in either mode.
KOSMOS_HD inline int moe_max_row_blocks(const MoeFwdShape& s) {
  const int a = moe_arena_rows(s, false), b = moe_arena_rows(s, true);
  return (a > b ? a : b) / s.tile_m;
}

// Built once per call by the layout item from the exchanged counts table
// [ep][E] (row src: rank src's counts), read by every CTA after kLaidOut.
struct MoeLayout {
  int dropless;                // the capped arena overflowed somewhere: dropless arena
  int rb[kMaxExperts + 1];     // [E_l + 1] first row block of local expert x; rb[E_l] = row blocks
  int src[2 * kMaxExperts];    // [E_l][ep + 1] rows of sources < s within expert x's segment
  int dst[kMaxExperts];        // [ep][E_l] arena row at rank d of our first row for d's expert x
  int ret[kMaxExperts];        // [ep][E_l] return row at rank s of our unit (x, s)
};

KOSMOS_HD inline int moe_src(const MoeFwdShape& s, const MoeLayout& L, int x, int src) {
  return L.src[x * (s.ep + 1) + src];
}
KOSMOS_HD inline int moe_row_blocks(const MoeFwdShape& s, const MoeLayout& L) { return L.rb[s.e_local]; }

// Our own experts' segments: rows per source and the row-block prefix.
KOSMOS_HD inline void moe_layout_own(const MoeFwdShape& s, const int* table, MoeLayout* L) {
  const int E = moe_experts(s);
  int run = 0;
  for (int x = 0; x < s.e_local; ++x) {
    int rows = 0;
    for (int src = 0; src < s.ep; ++src) {
      L->src[x * (s.ep + 1) + src] = rows;
      rows += table[src * E + s.rank * s.e_local + x];
    }
    L->src[x * (s.ep + 1) + s.ep] = rows;
    L->rb[x] = run;
    run += moe_cdiv(rows, s.tile_m);
  }
  L->rb[s.e_local] = run;
}

// Where our rows land at every rank d (d's segments, rows of sources before us),
// and where our units land at every rank s (s's packed start of the expert).
KOSMOS_HD inline void moe_layout_peers(const MoeFwdShape& s, const int* table, MoeLayout* L) {
  const int E = moe_experts(s);
  for (int d = 0; d < s.ep; ++d) {
    int run = 0;
    for (int x = 0; x < s.e_local; ++x) {
      int before = 0, rows = 0;
      for (int src = 0; src < s.ep; ++src) {
        if (src == s.rank) before = rows;
        rows += table[src * E + d * s.e_local + x];
      }
      L->dst[d * s.e_local + x] = run * s.tile_m + before;
      run += moe_cdiv(rows, s.tile_m);
    }
  }
  for (int src = 0; src < s.ep; ++src) {
    int run = 0;
    for (int e = 0; e < E; ++e) {
      if (e / s.e_local == s.rank) L->ret[src * s.e_local + e % s.e_local] = run;
      run += table[src * E + e];
    }
  }
}

KOSMOS_HD inline void moe_build_layout(const MoeFwdShape& s, const int* table, MoeLayout* L) {
  L->dropless = plan_overflow(table, s.ep * moe_experts(s), s.capacity);
  moe_layout_own(s, table, L);
  moe_layout_peers(s, table, L);
}

// Expert ex's segment at its owner as source `src` sees it, from the exchanged
// table [ep][E]: every source's rows, the rows of the sources before src, and
// the last source with rows (which zeroes the segment's padding rows: they
// share the row block of its last rows, so GEMM1 waits on its arrival).
struct MoeSegment {
  int rows, before, last_src;
};
KOSMOS_HD inline MoeSegment moe_segment(const MoeFwdShape& s, const int* table, int ex, int src) {
  const int E = moe_experts(s);
  MoeSegment g{0, 0, -1};
  for (int r = 0; r < s.ep; ++r) {
    const int c = table[r * E + ex];
    if (r == src) g.before = g.rows;
    if (c > 0) g.last_src = r;
    g.rows += c;
  }
  return g;
}

// After the plan, ends[b][E] (plan_scan's starts, advanced by plan_scatter to
// each block's end) holds the rows of each expert in blocks <= b.
KOSMOS_HD inline int moe_rows_before(const MoeFwdShape& s, const int* ends, int blocks, int e) {
  const int nb = moe_blocks(s), n = blocks < nb ? blocks : nb;
  return n == 0 ? 0 : ends[(n - 1) * moe_experts(s) + e];
}
// Where the fold finds pair (expert e, pos) of this rank: the return buffer
// (local = 0) or, for our own experts, the GEMM2 output in the arena (local = 1).
struct MoeRowRef {
  int local, row;
};
KOSMOS_HD inline MoeRowRef moe_pair_row(const MoeFwdShape& s, const MoeLayout& L, const int* start1, int e,
                                        int pos) {
  if (e / s.e_local != s.rank) return {0, start1[e] + pos};
  const int x = e % s.e_local;
  return {1, L.rb[x] * s.tile_m + moe_src(s, L, x, s.rank) + pos};
}

// One token's fold over elements [first, n) by step: sum of w[j] * row(j, i)
// over slots j = 0..k-1 in that order, in fp32, starting from slot 0's term
// (not 0.0f, which would turn -0.0 into +0.0): bitwise the same whoever folds.
template <class Row, class Out>
KOSMOS_HD void moe_fold_token(int k, const float* w, int n, int first, int step, const Row& row, const Out& out) {
  for (int i = first; i < n; i += step) {
    float acc = w[0] * row(0, i);
    for (int j = 1; j < k; ++j) acc += w[j] * row(j, i);
    out(i, acc);
  }
}

}  // namespace kosmos::moe
