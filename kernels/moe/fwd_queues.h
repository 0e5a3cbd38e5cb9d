// The MoE forward's queues (moe/fwd_sched.h): what item i of each queue is,
// and how many there are. Counts and flags are indexed as listed below; the
// order of each queue is the schedule (paper Table 1), argued in fwd_sched.h.
#pragma once

#include "gemm/tile_order.h"
#include "kosmos/platform.h"
#include "moe/fwd_layout.h"

namespace kosmos::moe {

enum class MoeQueue : int { kFront, kMove, kBuild, kCombine, kFold };
enum class MoeCount : int { kRouted, kScattered, kParts, kGemm1, kGemm2, kXParts };
// Flags by index: kReady[rank], kCounts[rank], kScanned/kPlanned/kLaidOut[0],
// kArrived[src * E_l + x], kGemm1/kGemm2[row block], kReturned[e] (e = d * E_l + x),
// kXArrived[src * E_l + x] (the backward's X rows at EP > 1).
enum class MoeFlag : int { kReady, kCounts, kScanned, kPlanned, kLaidOut, kArrived, kGemm1, kGemm2, kReturned,
                           kXArrived };
constexpr int kMoeFlags = 10;
// The flag's name, for a timed-out wait's report (WaitSite::flag).
KOSMOS_HD inline const char* moe_flag_name(MoeFlag f) {
  const char* const names[kMoeFlags] = {"ready", "counts", "scanned", "planned", "laid_out",
                                        "arrived", "gemm1", "gemm2", "returned", "x_arrived"};
  return names[(int)f];
}

KOSMOS_HD inline int moe_n_front(const MoeFwdShape& s) { return 2 * moe_blocks(s) + 1; }
// Dispatch parts of one kind (dY or x rows), and the move queue: the backward at
// EP > 1 pushes its X parts after every dY part (dgrad2 needs the dY rows first;
// only wgrad1, queued after every dgrad tile, reads X).
KOSMOS_HD inline int moe_n_parts(const MoeFwdShape& s) { return s.e_local * s.groups * s.ep; }
KOSMOS_HD inline int moe_n_move(const MoeFwdShape& s) { return moe_n_parts(s) * (s.x_parts ? 2 : 1); }
// GEMM row blocks: the layout's (the routed experts') and the shared expert's.
KOSMOS_HD inline int moe_n_gemm1(const MoeFwdShape& s, const MoeLayout& L) {
  return (moe_row_blocks(s, L) + s.shared_blocks) * s.nt1;
}
KOSMOS_HD inline int moe_n_build(const MoeFwdShape& s, const MoeLayout& L) {
  return (moe_row_blocks(s, L) + s.shared_blocks) * (s.nt1 + s.nt2);
}
KOSMOS_HD inline int moe_n_units(const MoeFwdShape& s) { return s.e_local * s.ep; }
// Fold items: kMoeFoldParts per plan block, so that the fold (a tail: with
// balanced routing every block reads every expert) spreads over about twice as
// many CTAs as a grid of one per SM has when t = 8192 and B = 128.
constexpr int kMoeFoldParts = 4;
KOSMOS_HD inline int moe_n_fold(const MoeFwdShape& s) { return moe_blocks(s) * kMoeFoldParts; }
// Fold item f: tokens [*first, *last) of plan block f / kMoeFoldParts (returned).
KOSMOS_HD inline int moe_fold_item(const MoeFwdShape& s, int f, int* first, int* last) {
  const int b = f / kMoeFoldParts, per = moe_cdiv(s.block_tokens, kMoeFoldParts);
  const int end = (b + 1) * s.block_tokens < s.tokens ? (b + 1) * s.block_tokens : s.tokens;
  *first = b * s.block_tokens + f % kMoeFoldParts * per;
  *last = *first + per < end ? *first + per : end;
  return b;
}
// i-th rank of a destination-minor rotation: rank + 1 first, our own last.
KOSMOS_HD inline int moe_rotated(const MoeFwdShape& s, int i) { return (s.rank + 1 + i) % s.ep; }

struct MoeMove {
  int x, g, dst;       // dst's local expert x, token group g
  bool xrows = false;  // the backward's X part (the forward's input rows), else the direction's rows
};
KOSMOS_HD inline MoeMove moe_move_item(const MoeFwdShape& s, int q) {
  const int n = moe_n_parts(s), j = q % n;
  return {j / (s.groups * s.ep), j / s.ep % s.groups, moe_rotated(s, j % s.ep), q >= n};
}

struct MoeTile {
  int gemm;    // 1 or 2
  int rb, x;   // row block (rows [rb * tile_m, + tile_m)), its local expert (e_local: the shared expert)
  int n;       // column block
};
// A Hopper build's passes (one engine run per GEMM; static shared memory, the
// claimer thread's): the claimed tile the next pass starts with (gemm == 0:
// none), and the tiles run so far (moe/fwd_sm90.cuh, moe/bwd_sm90.cuh).
struct MoePass {
  MoeTile pending;
  int ran;
};
// The engine's scheduler for one pass of tiles of kind `kind` (claimer thread
// only) over a build queue `Builds` (MoeBuilds, MoeBwdBuilds), whose
// coord(t, &m, &n) names a tile's row and column in its GEMM; a claim of
// another kind ends the pass and opens the next one with it.
template <class Builds>
struct MoePassSched {
  Builds* b;
  MoePass* pass;
  int kind, most;
  KOSMOS_DEVICE bool next(gemm::TileCoord& t) {
    if (pass->pending.gemm == 0) {
      if (most >= 0 && pass->ran >= most) return false;
      if (!b->next(&pass->pending)) return false;
    }
    if (pass->pending.gemm != kind) return false;  // the other kind's pass starts with it
    b->coord(pass->pending, &t.m, &t.n);
    pass->pending.gemm = 0;
    ++pass->ran;
    return true;
  }
};
// The local expert whose segment holds row block rb: the last x with rb[x] <= rb
// (empty experts share their successor's start).
KOSMOS_HD inline int moe_expert_of(const MoeFwdShape& s, const MoeLayout& L, int rb) {
  int lo = 0, hi = s.e_local;  // L.rb[lo] <= rb < L.rb[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (L.rb[mid] <= rb) lo = mid; else hi = mid;
  }
  return lo;
}
// Whether row block rb is the shared expert's.
KOSMOS_HD inline bool moe_shared_rb(const MoeFwdShape& s, int rb) { return s.shared_blocks > 0 && rb >= s.shared_rb0; }
// The expert of any row block: moe_expert_of, or e_local for the shared expert's.
KOSMOS_HD inline int moe_tile_expert(const MoeFwdShape& s, const MoeLayout& L, int rb) {
  return moe_shared_rb(s, rb) ? s.e_local : moe_expert_of(s, L, rb);
}
// A segment of the build queue (one GEMM's routed or shared row blocks, rows
// of them by nt column blocks) in gemm::SwizzledOrder's bands of s.band row
// blocks, column by column inside a band, as the floor's grouped GEMM walks
// them: the CTAs running at once then share a few B column blocks through L2
// instead of streaming a whole expert's weights per row block. Measured
// (benchmarks/RESULTS.md, MoE): a gain where experts span several row blocks
// of 64 column blocks (Llama 4 Scout, the shared expert), a few percent lost
// on small experts. Tile q of the segment.
KOSMOS_HD inline gemm::TileCoord moe_seg_tile(const MoeFwdShape& s, int rows, int nt, int q) {
  return gemm::SwizzledOrder{rows, nt, s.band}.at(q);
}
// Whether the routed experts' weights stream from memory once per row block:
// at most one row block an expert on average (Llama 4 Maverick: 64 rows an
// expert at 8192 tokens, its 32 GB of weights read at ~3.4 TB/s), so that a
// routed tile waits on memory while the shared expert's tiles, whose weights
// every row block of its bands shares through L2, wait on the tensor cores.
// Then each GEMM's shared tiles are spread among its routed ones, which keeps
// both busy at once, and the routed tiles go row block by row block (a band
// of one: no two row blocks share weights, and only one expert's rows need
// L2 at a time beside the shared expert's band).
KOSMOS_HD inline bool moe_mixes_shared(const MoeFwdShape& s, const MoeLayout& L) {
  return s.shared_blocks > 0 && moe_row_blocks(s, L) <= s.e_local;
}
// Item q of a GEMM's segment of rr routed and sh shared row blocks, nt tiles
// each, their tiles spread evenly: whether it is a shared one, and its index
// among its kind. Of items [0, q), floor(q sh / (rr + sh)) are shared, formed
// from q's quotient and remainder by rr + sh so that no product leaves 32 bits.
KOSMOS_HD inline bool moe_mixed_item(int rr, int sh, int q, int* i) {
  const int n = rr + sh, r = q % n;
  const int before = q / n * sh + r * sh / n, upto = q / n * sh + (r + 1) * sh / n;
  *i = upto > before ? before : q - before;
  return upto > before;
}
// Build item j. GEMM1: the shared expert's row blocks first (its rows are x's,
// ready at once: they fill the time the movers take to gather the routed
// rows), then the routed ones, expert-major. GEMM2: routed, then shared (the
// fold needs both, and every GEMM1 tile precedes every GEMM2 tile). Where the
// routed weights stream (moe_mixes_shared), each GEMM's shared tiles spread
// among its routed ones instead.
KOSMOS_HD inline MoeTile moe_build_item(const MoeFwdShape& s, const MoeLayout& L, int j) {
  const int rr = moe_row_blocks(s, L), sh = s.shared_blocks, n1 = moe_n_gemm1(s, L);
  const int gemm = j < n1 ? 1 : 2, nt = gemm == 1 ? s.nt1 : s.nt2, q = gemm == 1 ? j : j - n1;
  const bool mixed = moe_mixes_shared(s, L);
  bool shared;
  int i;  // the item's index among its kind's (shared or routed) tiles
  if (mixed) {
    shared = moe_mixed_item(rr, sh, q, &i);
  } else if (gemm == 1) {  // the shared row blocks first
    shared = q < sh * nt;
    i = shared ? q : q - sh * nt;
  } else {  // the shared row blocks last
    shared = q >= rr * nt;
    i = shared ? q - rr * nt : q;
  }
  if (shared) {
    const gemm::TileCoord c = moe_seg_tile(s, sh, nt, i);
    return {gemm, s.shared_rb0 + c.m, s.e_local, c.n};
  }
  const gemm::TileCoord c = mixed ? gemm::TileCoord{i / nt, i % nt} : moe_seg_tile(s, rr, nt, i);
  return {gemm, c.m, moe_expert_of(s, L, c.m), c.n};
}
// Whether row block rb (of expert x) holds rows from source src.
KOSMOS_HD inline bool moe_reads(const MoeFwdShape& s, const MoeLayout& L, int x, int rb, int src) {
  const int lo = (rb - L.rb[x]) * s.tile_m, a = moe_src(s, L, x, src), b = moe_src(s, L, x, src + 1);
  return a < b && a < lo + s.tile_m && b > lo;
}

struct MoeUnit {
  int x, dst;  // our local expert x's rows from (and back to) rank dst
};
KOSMOS_HD inline MoeUnit moe_unit_item(const MoeFwdShape& s, int u) { return {u / s.ep, moe_rotated(s, u % s.ep)}; }
// Arena rows [*row, *row + rows) of unit c.
KOSMOS_HD inline int moe_unit_rows(const MoeFwdShape& s, const MoeLayout& L, const MoeUnit& c, int* row) {
  *row = L.rb[c.x] * s.tile_m + moe_src(s, L, c.x, c.dst);
  return moe_src(s, L, c.x, c.dst + 1) - moe_src(s, L, c.x, c.dst);
}

// Dispatch part m: our rows [*begin, *end) of expert dst * E_l + x (plan order).
KOSMOS_HD inline void moe_part_rows(const MoeFwdShape& s, const int* ends, const MoeMove& m, int* begin, int* end) {
  const int per = moe_cdiv(moe_blocks(s), s.groups), e = m.dst * s.e_local + m.x;
  *begin = moe_rows_before(s, ends, m.g * per, e);
  *end = moe_rows_before(s, ends, (m.g + 1) * per, e);
}

}  // namespace kosmos::moe
