// The MoE forward's plan stage (paper §3.3.1 step 2) as plain host/device code:
// a stable counting sort of this rank's (token, slot) pairs into expert-major
// order, split so that the megakernel's CTAs can run it in parallel, and the
// CPU test runs the same functions (tests/host/moe_route_plan_emu.cc).
// Pair p = token * k + slot (token-major, as the twin kosmos_jax/reference/moe.py
// numbers them); indices[p] is its expert. Token block b holds tokens
// [b*B, min((b+1)*B, t)), so pairs [b*B*k, min((b+1)*B, t)*k).
//
//   (a) plan_histogram  per block, per expert: how many of the block's pairs
//                       go to the expert (one CTA per block; integer counts, so
//                       any order of adds, e.g. shared atomics, gives the same row);
//   (b) plan_scan       per expert, over the blocks in block order: the
//                       exclusive prefix sum of (a), i.e. where block b's pairs
//                       for expert e start among the expert's rows, and the
//                       expert's count;
//   (c) plan_scatter    per block: its pairs in token-major order take the next
//                       row of their expert, from the block's start of (b).
// Why this is the stable sort: a pair's row is (pairs of its expert in lower
// blocks) + (pairs of its expert earlier in its own block), which is exactly its
// rank among its expert's pairs in pair order. Nothing depends on which CTA
// runs which block or when, only on (b) scanning in block order and (c)
// numbering in token-major order within a block (one thread per block, or
// threads that rank lane-ordered, e.g. a warp's match mask and popc of lower
// lanes). The row order sets the expert GEMMs' accumulation order of dW, so a
// stable, deterministic order keeps training bitwise reproducible.
//
// Memory: hist[n_blocks, E] ints in global memory (plan_scan turns it into the
// blocks' starts in place); counts[E]; pos[t*k]; the segment starts [E + 1];
// order[] of the row space the caller picks (padded total, see plan_segments).
#pragma once

#include <cstddef>

#include "kosmos/platform.h"

namespace kosmos::moe {

struct PlanShape {
  int tokens;        // t: this rank's tokens
  int top_k;         // k: pairs per token
  int block_tokens;  // B: tokens per block
  int num_experts;   // E
};

KOSMOS_HD inline int plan_blocks(const PlanShape& s) { return (s.tokens + s.block_tokens - 1) / s.block_tokens; }

// Block b's pairs are [*first, *last).
KOSMOS_HD inline void plan_block_pairs(const PlanShape& s, int b, int* first, int* last) {
  const int end = (b + 1) * s.block_tokens < s.tokens ? (b + 1) * s.block_tokens : s.tokens;
  *first = b * s.block_tokens * s.top_k;
  *last = end * s.top_k;
}

// (a) hist_row[E] = per-expert pair counts of block b.
KOSMOS_HD inline void plan_histogram(const int* indices, const PlanShape& s, int b, int* hist_row) {
  for (int e = 0; e < s.num_experts; ++e) hist_row[e] = 0;
  int first, last;
  plan_block_pairs(s, b, &first, &last);
  for (int p = first; p < last; ++p) ++hist_row[indices[p]];
}

// (b) hist[n_blocks, E]: block counts in, block starts out (in place);
// counts[E] = each expert's pairs. Lanes split the experts; each expert's scan
// runs over the blocks in block order, which makes the blocks' rows ordered.
// A lane reads kBatch blocks' counts before it writes their starts: on a GPU the
// loads are then in flight together instead of one latency per block.
KOSMOS_HD inline void plan_scan(int* hist, const PlanShape& s, int* counts, int lane, int lanes) {
  constexpr int kBatch = 8;
  const int n_blocks = plan_blocks(s);
  for (int e = lane; e < s.num_experts; e += lanes) {
    int run = 0;
    for (int b0 = 0; b0 < n_blocks; b0 += kBatch) {
      int n[kBatch];
      for (int i = 0; i < kBatch; ++i) n[i] = b0 + i < n_blocks ? hist[(size_t)(b0 + i) * s.num_experts + e] : 0;
      for (int i = 0; i < kBatch && b0 + i < n_blocks; ++i) {
        hist[(size_t)(b0 + i) * s.num_experts + e] = run;
        run += n[i];
      }
    }
    counts[e] = run;
  }
}

// (c) Block b numbers its pairs, token-major: pos[p] is pair p's row among
// its expert's rows; order[start[e] + pos[p]] = p lists the pairs in the row
// space of start[E] (plan_segments: packed with tile 1, or tile-padded).
// cursor[E] is block b's row of plan_scan's starts, advanced here (the block
// owns it).
KOSMOS_HD inline void plan_scatter(const int* indices, const PlanShape& s, int b, int* cursor, const int* start,
                                   int* pos, int* order) {
  int first, last;
  plan_block_pairs(s, b, &first, &last);
  for (int p = first; p < last; ++p) {
    const int e = indices[p];
    const int row = cursor[e]++;
    pos[p] = row;
    order[start[e] + row] = p;
  }
}

// start[E + 1]: where each expert's segment begins in the grouped GEMM's row
// space, each segment padded to a multiple of kTileRows so that no tile of
// kTileRows rows straddles two experts (an expert without pairs takes no rows);
// start[E] is the total padded rows. kTileRows = 1 gives the packed starts.
template <int kTileRows>
KOSMOS_HD inline int plan_segments(const int* counts, int num_experts, int* start) {
  static_assert(kTileRows >= 1, "plan_segments: tile rows must be positive");
  int run = 0;
  for (int e = 0; e < num_experts; ++e) {
    start[e] = run;
    run += (counts[e] + kTileRows - 1) / kTileRows * kTileRows;
  }
  start[num_experts] = run;
  return run;
}

// The capped buffers' overflow test: some counts[i], i < n, exceeds the capacity (the
// layer then takes the dropless pass; never a silent drop). Every rank must
// agree, so the caller applies it to the exchanged counts and reduces it over
// the group, as the twin's plan does.
KOSMOS_HD inline bool plan_overflow(const int* counts, int n, int capacity) {
  for (int i = 0; i < n; ++i)
    if (counts[i] > capacity) return true;
  return false;
}

}  // namespace kosmos::moe
