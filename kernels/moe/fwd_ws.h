// The MoE forward's workspace: one byte buffer (the FFI's `ws` result), cut
// into sections of whole KiB. kosmos_jax/ops/_fused_moe.py computes the same
// total; the handler refuses a smaller buffer, naming both.
//
//   ctrl     kMoeCtrlBytes   MoeCtrl (moe/fwd_ctl.cuh) at EP = 1: zeroed before each launch
//                            (at EP > 1 it lives in the symmetric heap: moe/fwd_heap.h)
//   rb       32 per row block of R + S: GEMM1/GEMM2 flags and counts, zeroed with ctrl
//   hist     [nb][E] int
//   order    [R] int         (the packed plan order uses t*min(k, E) <= R of them)
//   arena    [R][H] bf16     the experts' input rows (padding rows zeroed); EP = 1 only:
//                            at EP > 1 peers push into it, so it is in the heap
//   act      [R + S][I] bf16 SwiGLU outputs (the shared expert's in the last S rows)
//   h1       [R][2I] bf16    the routed rows' pre-activations, gate | up; absent from
//                            a launch that keeps none (keep_preacts = 0: no backward reads it)
//
// arena, act and h1 are what the backward reuses (dgrad2's SwiGLU backward
// reads h1, wgrad2 act, wgrad1 the arena): the workspace is the forward's
// residual, and its padding rows are zeros (so h1's and act's are too), which
// the weight gradients' contractions over whole row blocks rely on.
//
// R = moe_rank_rows: the count-driven layout packs each source's pairs of our
// experts (a token picks an expert once: at most t * min(k, E_l) per source),
// each expert's segment padded to kTileRows, so R rows always suffice: no
// capped arena, no overflow, memory linear in tokens x k (moe/fwd_layout.h's
// dropless arena, the only one the launches use). S = moe_shared_rows:
// the shared expert's rows (t rounded up to kTileRows), or 0 without one; its
// input rows are x itself.
#pragma once
#include <cstddef>

#include "kosmos/platform.h"

namespace kosmos::moe {

constexpr size_t kMoeCtrlBytes = 65536;
constexpr int kMoeTileRows = 128;
constexpr int kMoeBlockTokens = 128;  // tokens per plan and fold block

KOSMOS_HD inline size_t moe_ws_align(size_t n) { return (n + 1023) / 1024 * 1024; }

KOSMOS_HD inline int moe_rank_rows(int t, int k, int ep, int e_local) {
  const long long pairs = (long long)ep * t * (k < e_local ? k : e_local) + (long long)e_local * (kMoeTileRows - 1);
  return (int)((pairs + kMoeTileRows - 1) / kMoeTileRows * kMoeTileRows);
}

// P: at EP > 1, the rows our units come back in (every pair of ours, in the
// packed send order: t * min(k, E)), which the fold copies into y_rows past its
// R + S rows, so that each pair's expert output row stays a row of y_rows (the
// backward's residual); 0 at EP = 1, where every row is already there.
KOSMOS_HD inline int moe_return_rows(int t, int k, int ep, int E) { return ep > 1 ? t * (k < E ? k : E) : 0; }

KOSMOS_HD inline int moe_shared_rows(int t, bool shared) {
  return shared ? (t + kMoeTileRows - 1) / kMoeTileRows * kMoeTileRows : 0;
}

// The sections both directions' workspaces begin with (ctrl to arena, the same
// sizes: the backward's front replans the forward's routing into the same rows);
// `end` is where the direction's own sections start.
struct MoeWsHead {
  size_t ctrl, rb, hist, order, arena, end;  // byte offsets
};

KOSMOS_HD inline MoeWsHead moe_ws_head(int t, int k, int ep, int e_local, int H, bool shared) {
  const int E = ep * e_local;
  const size_t R = (size_t)moe_rank_rows(t, k, ep, e_local), S = (size_t)moe_shared_rows(t, shared);
  const size_t nb = (size_t)(t + kMoeBlockTokens - 1) / kMoeBlockTokens;
  MoeWsHead w{};
  w.ctrl = 0;
  w.rb = w.ctrl + moe_ws_align(kMoeCtrlBytes);
  w.hist = w.rb + moe_ws_align((R + S) / kMoeTileRows * 32);
  w.order = w.hist + moe_ws_align(nb * E * 4);
  w.arena = w.order + moe_ws_align(R * 4);
  w.end = w.arena + (ep == 1 ? moe_ws_align(R * H * 2) : 0);
  return w;
}

struct MoeWs : MoeWsHead {
  size_t act, h1, total;  // byte offsets, and the whole
  size_t zeroed;          // bytes from 0 the launcher clears
};

KOSMOS_HD inline MoeWs moe_ws_layout(int t, int k, int ep, int e_local, int H, int I, bool shared,
                                     bool keep_preacts = true) {
  const size_t R = (size_t)moe_rank_rows(t, k, ep, e_local), S = (size_t)moe_shared_rows(t, shared);
  MoeWs w{};
  static_cast<MoeWsHead&>(w) = moe_ws_head(t, k, ep, e_local, H, shared);
  w.act = w.end;
  w.h1 = w.act + moe_ws_align((R + S) * I * 2);
  w.total = w.h1 + (keep_preacts ? moe_ws_align(R * 2 * I * 2) : 0);
  w.zeroed = w.hist;
  return w;
}

}  // namespace kosmos::moe
