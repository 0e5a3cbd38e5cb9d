// The MoE backward megakernel's build queue (paper §3.3.2), plain host/device
// code. The backward runs the forward's CTA life (moe_fwd_cta, moe/fwd_sched.h)
// over the same plan: the front recomputes the forward's layout from the same
// routing, so every pair has the row it had in the forward; the move queue's
// parts gather each pair's dY row (output gating: scaled by its weight) into
// the arena (the x rows are the forward's: in its workspace at EP = 1; at
// EP > 1 the movers push them again, into the owners' X arenas); the combine
// queue returns the dX rows; the fold sums a token's k dX rows (and the shared
// expert's) in slot order. Only the build queue differs, and the words of the
// work that its Ops do (the Hopper kernel: moe/bwd_sm90.cuh). Per
// row block, as the forward's GEMM1 and GEMM2 (the same items, flags and
// counts, moe_build_item):
//
//  dgrad2  kind 1, tile (rb, n): dA = dY_rows @ W2[e]^T, column block n of I,
//          the SwiGLU backward in the epilogue (from the forward's saved
//          pre-activations h1): d(gate | up) of the same I columns (wgrad2
//          reads the forward's act). Waits for its rows to
//          arrive; completes kGemm1[rb] once all nt1 tiles are done.
//  dgrad1  kind 2, tile (rb, n): dX_rows = d(gate | up) @ W1[e]^T, column
//          block n of H, K = 2I. Waits for kGemm1[rb]; completes kGemm2[rb],
//          which units (the dX combine) and the fold wait for.
//
// then every expert's wgrad2 tiles, then every expert's wgrad1 tiles (the
// routed experts in order, then the shared expert; kind-major, so a Hopper
// builder switches its engine's operands at most twice more), each once its
// expert's row blocks' dgrad2 tiles are done (every wgrad tile follows every
// dgrad2 tile in the queue, so they are claimed; a wgrad waits on nothing
// else but, at EP > 1, wgrad1 on its X rows, which every rank's movers push
// after their dY parts; nothing in the launch waits on a wgrad):
//
//  wgrad2  kind 3, tile n of nw2: a block of dW2[x] [I, H] = act[x]^T @ dY_rows[x]
//  wgrad1  kind 4, tile n of nw1: a block of dW1[x] [H, 2I] = X_rows[x]^T @ d(gate | up)[x]
//
// each summed over the expert's rows in the plan's stable row order (so dW is
// bitwise reproducible), an expert without rows writing zeros. The wgrads come
// after every dgrad1 tile: the dX rows return (units, pushed by two-way movers
// between tiles) while the weight gradients are computed.
#pragma once

#include "kosmos/platform.h"
#include "moe/fwd_sched.h"

namespace kosmos::moe {

enum class MoeBwdKind : int { kDgrad2 = 1, kDgrad1 = 2, kWgrad2 = 3, kWgrad1 = 4 };

// Weight-gradient tiles per expert: of dW2 [I, H] and of dW1 [H, 2I]; an
// engine that builds them says how many column blocks a row of tiles has
// (cols2, cols1: tile n is row n / cols, column n % cols; 0 where no engine
// needs it, as in the host emulation).
struct MoeWgradTiles {
  int nw2, nw1;
  int cols2 = 0, cols1 = 0;
};

// Experts with weight gradients on this rank: the local ones, and the shared one.
KOSMOS_HD inline int moe_bwd_experts(const MoeFwdShape& s) { return s.e_local + (s.shared_blocks > 0); }
KOSMOS_HD inline int moe_n_wgrad(const MoeFwdShape& s, const MoeWgradTiles& w) {
  return moe_bwd_experts(s) * (w.nw2 + w.nw1);
}
KOSMOS_HD inline int moe_n_bwd_build(const MoeFwdShape& s, const MoeLayout& L, const MoeWgradTiles& w) {
  return moe_n_build(s, L) + moe_n_wgrad(s, w);
}

// Build item j: the forward's items as dgrad2 / dgrad1, then the wgrads,
// kind-major, expert-major within a kind (rb unused: -1; x = e_local is the
// shared expert).
KOSMOS_HD inline MoeTile moe_bwd_build_item(const MoeFwdShape& s, const MoeLayout& L, const MoeWgradTiles& w, int j) {
  const int nd = moe_n_build(s, L), q = j - nd, all2 = moe_bwd_experts(s) * w.nw2;
  if (j < nd) return moe_build_item(s, L, j);
  return q < all2 ? MoeTile{(int)MoeBwdKind::kWgrad2, -1, q / w.nw2, q % w.nw2}
                  : MoeTile{(int)MoeBwdKind::kWgrad1, -1, (q - all2) / w.nw1, (q - all2) % w.nw1};
}

// A build tile as an engine's (row, column) of its GEMM: a dgrad's row block
// and column block; a wgrad's row of dW tiles (expert x's rows per = nw / cols
// first) and column block.
KOSMOS_HD inline void moe_bwd_coord(const MoeWgradTiles& w, const MoeTile& t, int* m, int* n) {
  if (t.gemm <= (int)MoeBwdKind::kDgrad1) {
    *m = t.rb, *n = t.n;
    return;
  }
  const bool two = t.gemm == (int)MoeBwdKind::kWgrad2;
  const int cols = two ? w.cols2 : w.cols1, per = (two ? w.nw2 : w.nw1) / cols;
  *m = t.x * per + t.n / cols, *n = t.n % cols;
}

// Row blocks [*first, *last) of expert x (e_local: the shared expert's).
KOSMOS_HD inline void moe_expert_row_blocks(const MoeFwdShape& s, const MoeLayout& L, int x, int* first, int* last) {
  *first = x == s.e_local ? s.shared_rb0 : L.rb[x];
  *last = x == s.e_local ? s.shared_rb0 + s.shared_blocks : L.rb[x + 1];
}

// The backward's build queue as a tile source (MoeBuilds' interface): the
// dgrad tiles are the forward's GEMM1 / GEMM2 items, waits and counts; `Ops`
// supplies dgrad2(t), dgrad1(t), wgrad2(t), wgrad1(t) beside the control words.
template <class Ops>
struct MoeBwdBuilds {
  Ops& ops;
  const MoeFwdShape& s;
  const MoeLayout& L;
  MoeWgradTiles w;

  KOSMOS_MOE_INLINE MoeBuilds<Ops> rows() const { return MoeBuilds<Ops>{ops, s, L}; }
  KOSMOS_MOE_INLINE bool next(MoeTile* t) {
    const int j = ops.claim(MoeQueue::kBuild);
    if (j >= moe_n_bwd_build(s, L, w)) return false;
    *t = moe_bwd_build_item(s, L, w, j);
    return true;
  }
  KOSMOS_MOE_INLINE void start(const MoeTile& t) {
    if (t.gemm <= (int)MoeBwdKind::kDgrad1) return rows().start(t);
    int first, last;
    moe_expert_row_blocks(s, L, t.x, &first, &last);
    for (int rb = first; rb < last; ++rb) ops.wait(MoeFlag::kGemm1, rb);
    // At EP > 1 wgrad1's X rows come in X parts of their own (s.x_parts), after the dY rows.
    if (t.gemm == (int)MoeBwdKind::kWgrad1 && s.x_parts && t.x < s.e_local)
      for (int src = 0; src < s.ep; ++src)
        if (moe_src(s, L, t.x, src + 1) > moe_src(s, L, t.x, src)) ops.wait(MoeFlag::kXArrived, src * s.e_local + t.x);
  }
  KOSMOS_MOE_INLINE void done(const MoeTile& t) {
    if (t.gemm <= (int)MoeBwdKind::kDgrad1) rows().done(t);
  }
  KOSMOS_MOE_INLINE void coord(const MoeTile& t, int* m, int* n) const { moe_bwd_coord(w, t, m, n); }
  KOSMOS_MOE_INLINE void run(const MoeTile& t) {
    switch ((MoeBwdKind)t.gemm) {
      case MoeBwdKind::kDgrad2: ops.dgrad2(t); break;
      case MoeBwdKind::kDgrad1: ops.dgrad1(t); break;
      case MoeBwdKind::kWgrad2: ops.wgrad2(t); break;
      default: ops.wgrad1(t); break;
    }
  }
};

}  // namespace kosmos::moe
