// The MoE forward's workspace at EP = 1: one byte buffer (the FFI's `ws`
// result), cut into sections of whole KiB. kosmos_jax/ops/_fused_moe.py
// computes the same total; the handler refuses a smaller buffer, naming both.
//
//   ctrl     kMoeCtrlBytes   MoeCtrl (moe/fwd_ctl.cuh): zeroed before each launch
//   rb       32 per row block of R + S: GEMM1/GEMM2 flags and counts, zeroed with ctrl
//   hist     [nb][E] int
//   order    [R] int         (the packed plan order uses t*k <= R of them)
//   arena    [R][H] bf16     the experts' input rows (padding rows zeroed)
//   act      [R + S][I] bf16 SwiGLU outputs (the shared expert's in the last S rows)
//   h1       [R][2I] bf16    the routed rows' pre-activations, gate | up
//
// arena, act and h1 are what the backward reuses (dgrad2's SwiGLU backward
// reads h1, wgrad2 act, wgrad1 the arena): the workspace is the forward's
// residual, and its padding rows are zeros (so h1's and act's are too), which
// the weight gradients' contractions over whole row blocks rely on.
//
// R = moe_ep1_rows: with one rank the count-driven layout packs t * min(k, E)
// pairs, each expert's segment padded to kTileRows, so R rows always suffice:
// no capped arena, no overflow, memory linear in tokens x k. S = moe_shared_rows:
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

KOSMOS_HD inline int moe_ep1_rows(int t, int k, int E) {
  const long long pairs = (long long)t * (k < E ? k : E) + (long long)E * (kMoeTileRows - 1);
  return (int)((pairs + kMoeTileRows - 1) / kMoeTileRows * kMoeTileRows);
}

KOSMOS_HD inline int moe_shared_rows(int t, bool shared) {
  return shared ? (t + kMoeTileRows - 1) / kMoeTileRows * kMoeTileRows : 0;
}

struct MoeWs {
  size_t ctrl, rb, hist, order, arena, act, h1, total;  // byte offsets, and the whole
  size_t zeroed;                                    // bytes from 0 the launcher clears
};

KOSMOS_HD inline MoeWs moe_ws_layout(int t, int k, int E, int H, int I, bool shared) {
  const size_t R = (size_t)moe_ep1_rows(t, k, E), S = (size_t)moe_shared_rows(t, shared);
  const size_t nb = (size_t)(t + kMoeBlockTokens - 1) / kMoeBlockTokens;
  MoeWs w{};
  w.ctrl = 0;
  w.rb = w.ctrl + moe_ws_align(kMoeCtrlBytes);
  w.hist = w.rb + moe_ws_align((R + S) / kMoeTileRows * 32);
  w.order = w.hist + moe_ws_align(nb * E * 4);
  w.arena = w.order + moe_ws_align(R * 4);
  w.act = w.arena + moe_ws_align(R * H * 2);
  w.h1 = w.act + moe_ws_align((R + S) * I * 2);
  w.total = w.h1 + moe_ws_align(R * 2 * I * 2);
  w.zeroed = w.hist;
  return w;
}

}  // namespace kosmos::moe
