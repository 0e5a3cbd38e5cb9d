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

// A token's fold over the vectors v0 + 32 * i (i < kV) of its output row: the
// sum over slots j = 0..k-1 in that order of w_j * row_j, fp32 products then
// fp32 sums (no contraction: the twin's fold), rounded once. Lane j holds slot
// j's row (`row`) and weight (`wt`); kJ = kFoldDepth / kV slots'
// loads are in flight at once, so kFoldDepth vectors per lane whatever k
// (measured: 4 deep, a 210 us fold tail on Qwen3-30B-A3B; 8 deep, 189 us; more
// spills at the Hopper kernel's 168 registers).
constexpr int kFoldDepth = 8;
template <int kV>
KOSMOS_DEVICE void moe_fold_vecs(const bf16_t* rows, bf16_t* y, int H, int k, int row, float wt, int v0, int vecs) {
  constexpr int kJ = kFoldDepth / kV;
  float acc[kV][8];
  for (int j0 = 0; j0 < k; j0 += kJ) {
    uint4 u[kJ][kV];
    float w[kJ];
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const int slot = j0 + j < k ? j0 + j : k - 1;  // every lane shuffles: the source lane must take part
      const int r = lanes32_shfl(row, slot);
      w[j] = lanes32_shfl(wt, slot);
#pragma unroll
      for (int i = 0; i < kV; ++i)
        if (j0 + j < k && v0 + 32 * i < vecs)
          u[j][i] = *reinterpret_cast<const uint4*>(rows + (size_t)r * H + (v0 + 32 * i) * 8);
    }
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      if (j0 + j >= k) break;
#pragma unroll
      for (int i = 0; i < kV; ++i) {
        const bf16_t* h = reinterpret_cast<const bf16_t*>(&u[j][i]);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float term = __fmul_rn(w[j], to_f32(h[e]));
          acc[i][e] = j0 + j == 0 ? term : __fadd_rn(acc[i][e], term);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    const int v = v0 + 32 * i;
    if (v >= vecs) continue;
    uint4 out;
    bf16_t* o = reinterpret_cast<bf16_t*>(&out);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = from_f32<bf16_t>(acc[i][e]);
    reinterpret_cast<uint4*>(y)[v] = out;
  }
}

// A token's whole output row, kV vectors per lane step (kV * k >= kFoldDepth
// where k allows). Whole 32-lane rounds, so every lane takes part in each
// round's shuffles even where H / 8 is not a multiple of 32 * kV (the rounds'
// loads and stores skip the vectors past the row). Lane j < k also prefetches
// its slot's chunk of the next round into L2 (on the last round, the chunk of
// row `next`: its slot's row in the warp's next token, or -1): the loads in
// flight are capped by registers (kFoldDepth), the prefetch is not. Measured on
// the fold's access pattern alone (a standalone copy of this loop, not kept;
// 2026-12-04, 1xH200, 8192 tokens, benchmarks/RESULTS.md): Qwen3-30B-A3B 116.5
// -> 97.8 us, DeepSeek-V3 483.6 -> 376.0 us; two rounds ahead 102.7 / 407.7,
// four 117.4 / 543.8 (prefetched lines evicted before their loads).
template <int kV>
KOSMOS_DEVICE void moe_fold_row(const bf16_t* rows, bf16_t* y, int H, int k, int row, float wt, int lane, int next) {
  const int vecs = H / 8, step = 32 * kV;
  for (int base = 0; base < vecs; base += step) {
    if (lane < k) {
      const int nb = base + step;
      if (nb < vecs) l2_prefetch(rows + (size_t)row * H + (size_t)nb * 8, (vecs - nb < step ? vecs - nb : step) * 16);
      else if (next >= 0) l2_prefetch(rows + (size_t)next * H, (vecs < step ? vecs : step) * 16);
    }
    moe_fold_vecs<kV>(rows, y, H, k, row, wt, base + lane, vecs);
  }
}

}  // namespace kosmos::moe
