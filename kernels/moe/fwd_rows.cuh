// The MoE forward's row traffic, one warp (32-lane group, kosmos/platform.h)
// per row or token: the dispatch gather (a token row into its arena row, ours
// or a peer's), the combine's copies and the fold (a token's k expert rows
// into its output row). Both are bandwidth work on HBM, so each lane puts
// several 16-byte loads in flight before it uses any of them: a loop that
// loads, then stores or adds, keeps one load per lane in flight and runs at a
// few GB/s per SM (one load latency per 16 bytes).
#pragma once
#include <cstdint>

#include "kosmos/platform.h"
#include "kosmos/types.h"

namespace kosmos::moe {

// A 16-byte load of a row this launch wrote (another CTA's GEMM output, a
// peer's push): from L2, never a read-only or L1 line an earlier read of the
// same address left behind (the acquire that preceded it orders, this keeps it
// fresh). HIP's plain load is coherent at this scope.
KOSMOS_DEVICE uint4 moe_load_fresh(const uint4* p) {
#if defined(KOSMOS_CUDA)
  return __ldcg(p);
#else
  return *p;
#endif
}

// One row of `vecs` 16-byte vectors (8 bf16 each) copied by one warp, kDepth
// vectors per lane in flight; with `scale`, each element becomes bf16(w * x)
// (input gating: the twin rounds the scaled row once). kFresh: the row was
// written during this launch (moe_load_fresh), else it is a launch input,
// read through the read-only cache.
template <int kDepth = 8, bool kFresh = false>
KOSMOS_DEVICE void moe_copy_row(const uint4* from, uint4* to, int vecs, int lane, bool scale, float w) {
  for (int v0 = lane; v0 < vecs; v0 += 32 * kDepth) {
    uint4 u[kDepth];
#pragma unroll
    for (int i = 0; i < kDepth; ++i)
      if (v0 + 32 * i < vecs) u[i] = kFresh ? moe_load_fresh(from + v0 + 32 * i) : __ldg(from + v0 + 32 * i);
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
      if (v0 + 32 * i >= vecs) continue;
      if (scale) {
        bf16_t* h = reinterpret_cast<bf16_t*>(&u[i]);
#pragma unroll
        for (int e = 0; e < 8; ++e) h[e] = from_f32<bf16_t>(__fmul_rn(w, to_f32(h[e])));
      }
      to[v0 + 32 * i] = u[i];
    }
  }
}

// The fold's rounds: kFoldSlots rows of a token (a slot group) times 32
// 16-byte vectors (a column block), one vector per lane and row; a stage of a
// warp's ring holds one round (4 KiB).
constexpr int kFoldSlots = 8;
constexpr int kFoldStageVecs = kFoldSlots * 32;
// Shared memory of a fold item: its (token, slot) rows and weights, then each
// warp's ring of `stages` stages.
constexpr int moe_fold_smem_bytes(int max_tokens, int stages, int warps) {
  return 2 * max_tokens * 32 * 4 + stages * warps * kFoldStageVecs * 16;
}

// One warp's tokens of a fold item, tokens warp, warp + warps, ... of n: each
// token's output row y[t] = the sum over its slots j = 0..slots-1 in that order
// of wt[t][j] * rows[at[t][j]], fp32 products then fp32 sums (no contraction:
// the twin's fold), rounded once. at / wt: [n][slots] in shared memory; y: the
// item's first output row; ring: the warp's kStages stages.
// The rounds run back to back across the warp's tokens with kStages - 1 of them
// in flight behind the one being summed (async_copy16: no registers held), so a
// lane keeps 8 (kStages - 1) loads going whatever the token's k, where loads
// into registers were capped at 8 by the megakernel's 168 registers. Measured on
// the fold's access pattern alone (a standalone copy, not kept; 2026-12-04,
// 1xH200, 8192 tokens; benchmarks/RESULTS.md): Qwen3-30B-A3B 93.7 us, DeepSeek-V3
// 351.5 us with 2 stages, against 97.9 / 376.6 us for 8 register loads a lane
// and an L2 prefetch of the next round (116 / 485 without it); 3 or 4 stages
// the same as 2. Lane l copies and later reads only its own cells of a stage,
// so no lane waits for another's copies (the wait covers the thread's own).
template <int kStages>
KOSMOS_DEVICE void moe_fold_warp(const bf16_t* rows, bf16_t* y, int H, int slots, int n, const int* at, const float* wt,
                                 uint4* ring, int warp, int warps, int lane) {
  const int vecs = H / 8, groups = (slots + kFoldSlots - 1) / kFoldSlots;
  const int per = groups * ((vecs + 31) / 32), total = warp < n ? (n - 1 - warp) / warps * per + per : 0;
  auto issue = [&](int q) {
    if (q < total) {
      const int t = warp + q / per * warps, c = q % per, v = c / groups * 32 + lane, j0 = c % groups * kFoldSlots;
      uint4* stage = ring + q % kStages * kFoldStageVecs + lane;
#pragma unroll
      for (int j = 0; j < kFoldSlots; ++j)
        if (j0 + j < slots && v < vecs) async_copy16(stage + 32 * j, rows + (size_t)at[t * slots + j0 + j] * H + v * 8);
    }
    async_commit();  // an empty group past the end keeps the count of groups in flight
  };
  for (int q = 0; q < kStages - 1; ++q) issue(q);
  float acc[8];
  for (int q = 0; q < total; ++q) {
    // The stage this lane read last round is overwritten next: its reads first.
    lanes32_sync();
    issue(q + kStages - 1);
    async_wait<kStages - 1>();
    const int t = warp + q / per * warps, c = q % per, v = c / groups * 32 + lane, g = c % groups;
    if (v >= vecs) continue;
    const uint4* stage = ring + q % kStages * kFoldStageVecs + lane;
#pragma unroll
    for (int j = 0; j < kFoldSlots; ++j) {
      const int slot = g * kFoldSlots + j;
      if (slot >= slots) break;
      const uint4 u = stage[32 * j];
      const bf16_t* h = reinterpret_cast<const bf16_t*>(&u);
      const float w = wt[t * slots + slot];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float term = __fmul_rn(w, to_f32(h[e]));
        acc[e] = slot == 0 ? term : __fadd_rn(acc[e], term);
      }
    }
    if (g == groups - 1) {
      uint4 out;
      bf16_t* o = reinterpret_cast<bf16_t*>(&out);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = from_f32<bf16_t>(acc[e]);
      reinterpret_cast<uint4*>(y + (size_t)t * H)[v] = out;
    }
  }
  async_wait<0>();
}

}  // namespace kosmos::moe
