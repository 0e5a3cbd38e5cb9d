// The MoE forward's row traffic, members of MoeLocalOps (moe/fwd_ops.cuh,
// which includes this file after the struct; its comment holds the lanes,
// workspace and memory-model rules these follow): the dispatch parts, the
// combine units at EP > 1 and the fold, over the warp-level copies of
// moe/fwd_rows.cuh.
#pragma once
#include <cstddef>

#include "kosmos/trace.h"
#include "moe/fwd_rows.cuh"

namespace kosmos::moe {

// Combine unit c at EP > 1 (c.dst is a peer): our expert c.x's output rows for
// source c.dst, one contiguous run of our y_rows, into c.dst's returned rows at
// its packed start of the expert (a warp per row); the caller's release of
// returned[e] at c.dst follows the barrier.
KOSMOS_DEVICE void MoeLocalOps::push_unit(const MoeUnit& c) {
  const TraceSpan span;
  int row;
  const int rows = moe_unit_rows(s(), layout(), c, &row), H = p().H;
  const int at = layout().ret[c.dst * s().e_local + c.x];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < rows; r += blockDim.x / 32)
    moe_copy_row<8, true>(reinterpret_cast<const uint4*>(p().y_rows + (size_t)(row + r) * H),
                 reinterpret_cast<uint4*>(p().peer_ret[c.dst] + (size_t)(at + r) * H), H / 8, lane, false, 1.f);
  __syncthreads();
  if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceMove, (c.x * s().ep + c.dst) | 1 << 30);
}

// Dispatch part m: our rows for expert m.dst * E_l + m.x from token group m.g,
// gathered into their rows of rank m.dst's arena (our own at EP = 1; a peer's
// heap otherwise), a warp per row (moe_copy_row). Input gating sends
// bf16(w * x), the twin's rounding of the scaled row. The segment's padding
// rows become zeros, written by the last group's part of the last source with
// rows in it (so before the arrival that GEMM1's last row block of the segment
// waits on): their products are then zeros, and the backward's weight
// gradients contract whole row blocks of them. The backward's X part (m.xrows)
// sends the forward's input rows into the X arena the same way, scaled as the
// forward's arena rows were: the backward's input_gating is the forward's
// turned over (its dY rows carry the weight under output gating), so X rows
// carry it when the backward's dY rows do not.
KOSMOS_DEVICE void MoeLocalOps::push_part(const MoeMove& m) {
  const TraceSpan span;
  const int ex = m.dst * s().e_local + m.x, k = s().top_k, H = p().H;
  int begin, end;
  moe_part_rows(s(), ends(), m, &begin, &end);
  const int at = layout().dst[ex], start = p().ctrl->start1[ex];
  bf16_t* arena = m.xrows ? p().peer_xrows[m.dst] : m.dst == s().rank ? p().arena : p().peer_arena[m.dst];
  const bf16_t* x = m.xrows ? p().x_fwd : p().x;
  const bool gated = m.xrows ? !p().input_gating : p().input_gating != 0;
  // A row's source is known only from order[], a load before the row's own: the
  // warp loads the pair two rows ahead and L2-prefetches the row one ahead (a
  // bulk prefetch, no registers), so neither latency is paid in series per row.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, W = blockDim.x / 32;
  const int* order = p().order + start;
  const int r0 = begin + warp;
  int q = r0 < end ? order[r0] : 0, qn = r0 + W < end ? order[r0 + W] : -1;
  for (int r = r0; r < end; r += W) {
    if (qn >= 0 && lane == 0) l2_prefetch(x + (size_t)(qn / k) * H, H * 2);
    const int qnn = r + 2 * W < end ? order[r + 2 * W] : -1;
    const uint4* from = reinterpret_cast<const uint4*>(x + (size_t)(q / k) * H);
    uint4* to = reinterpret_cast<uint4*>(arena + (size_t)(at + r) * H);
    moe_copy_row(from, to, H / 8, lane, gated, gated ? p().weights[q] : 1.f);
    q = qn, qn = qnn;
  }
  if (m.g == s().groups - 1) {
    const MoeSegment g = moe_segment(s(), p().ctrl->table, ex, s().rank);
    if (g.last_src == s().rank) {
      const int base = at - g.before, padded = moe_cdiv(g.rows, s().tile_m) * s().tile_m;
      for (int r = g.rows + warp; r < padded; r += blockDim.x / 32) {
        uint4* to = reinterpret_cast<uint4*>(arena + (size_t)(base + r) * H);
        for (int v = lane; v < H / 8; v += 32) to[v] = make_uint4(0, 0, 0, 0);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0)
    span.close(p().trace, ctl.cta, kTraceMove, ((m.xrows * s().e_local + m.x) * s().groups + m.g) * s().ep + m.dst);
}

// Fold item: tokens [first, last), each warp its share (moe_fold_warp): a
// token's k routed rows, then its shared expert row with weight 1, the twin's
// order (reference.moe_forward: fold, then + y_s). The whole CTA first locates
// every (token, slot) row of the item into shared memory, turning each pair's
// pos into its row of y_rows (pair_row, for the backward): the lookup is a
// chain of dependent loads (indices, then the layout) that a warp per token
// would pay before each token's first row load. At EP > 1 a pair whose expert
// lives on a peer came back into our returned rows: the warps first copy those
// into y_rows past the R + S rows (their residual rows, >= tail), then the CTA
// folds from y_rows alone.
// Shared memory (scratch): moe_fold_smem_bytes(kMoeFoldMaxTokens, kStages,
// blockDim.x / 32), which the Hopper kernels assert (moe_fold_fits_rings) and the
// portable kernels' shared union holds. The peers' rows are stored by the warps
// and read by cp.async (through L2) after the CTA barrier, which orders them.
// The launchers' plan blocks (kMoeBlockTokens) make a fold item at most this many tokens.
constexpr int kMoeFoldMaxTokens = (kMoeBlockTokens + kMoeFoldParts - 1) / kMoeFoldParts;
// The Hopper kernels fold with this many stages a warp, in their engine's A and
// B rings (idle while they fold; contiguous from the front's scratch, the A ring).
constexpr int kMoeFoldStagesSm90 = 2;
template <class Storage>
constexpr bool moe_fold_fits_rings() {
  return offsetof(Storage, b) - offsetof(Storage, a) == sizeof(Storage::a) &&
         sizeof(Storage::a) + sizeof(Storage::b) >=
             (size_t)moe_fold_smem_bytes(kMoeFoldMaxTokens, kMoeFoldStagesSm90, kMoeThreads / 32);
}
template <bool kPeers, int kStages>
KOSMOS_DEVICE void MoeLocalOps::fold(int item, int first, int last) {
  const TraceSpan span;
  const int k = s().top_k, H = p().H, slots = k + (s().shared_blocks > 0), tail = p().rbs * s().tile_m;
  const int n = last - first;
  int* rows = scratch;                                                 // [n][slots]
  float* wts = reinterpret_cast<float*>(scratch + kMoeFoldMaxTokens * 32);  // [n][slots]
  for (int i = threadIdx.x; i < n * slots; i += blockDim.x) {
    const int tok = first + i / slots, j = i % slots;
    int row = s().shared_rb0 * s().tile_m + tok;
    float wt = 1.f;
    if (j < k) {
      int* pr = p().pair_row + (size_t)tok * k + j;
      const MoeRowRef ref = moe_pair_row(s(), layout(), p().ctrl->start1, p().indices[(size_t)tok * k + j], *pr);
      row = ref.local ? ref.row : tail + ref.row;
      *pr = row;
      if (!p().input_gating) wt = p().weights[(size_t)tok * k + j];
    }
    rows[i] = row;
    wts[i] = wt;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (peers<kPeers>()) {
    for (int i = warp; i < n * k; i += warps) {
      const int rj = rows[i / k * slots + i % k];
      if (rj >= tail)
        moe_copy_row<8, true>(reinterpret_cast<const uint4*>(p().peer_ret[s().rank] + (size_t)(rj - tail) * H),
                              reinterpret_cast<uint4*>(p().y_rows + (size_t)rj * H), H / 8, lane, false, 1.f);
    }
    __syncthreads();  // every warp's copies before any fold reads them
  }
  uint4* ring = reinterpret_cast<uint4*>(scratch + 2 * kMoeFoldMaxTokens * 32) + warp * kStages * kFoldStageVecs;
  moe_fold_warp<kStages>(p().y_rows, p().y + (size_t)first * H, H, slots, n, rows, wts, ring, warp, warps, lane);
  __syncthreads();  // every warp's reads of the located rows before the next item's
  if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceReduce, item);
}

}  // namespace kosmos::moe
