// The MoE forward's plan steps, members of MoeLocalOps (moe/fwd_ops.cuh,
// which includes this file after the struct; its comment holds the lanes,
// workspace and memory-model rules these follow): the front's histogram of a
// plan block, the scan of the counts into expert starts, the count exchange,
// the scatter of a block's pairs into expert-major rows, and the layout.
#pragma once
#include "kosmos/platform.h"
#include "kosmos/trace.h"
#include "moe/fwd_layout.h"
#include "moe/plan.h"

namespace kosmos::moe {

// Exclusive prefix sums of v[0, n) (shared memory), in place, by every thread
// of the CTA; returns the total. tmp: blockDim.x ints of shared memory. Each
// thread sums a run of v, a Hillis-Steele scan over the runs' sums gives each
// run's start. Integer sums: the order of adds does not change the result.
KOSMOS_DEVICE int cta_exclusive_scan(int* v, int n, int* tmp) {
  const int T = blockDim.x, t = threadIdx.x, per = (n + T - 1) / T;
  const int lo = t * per < n ? t * per : n, hi = lo + per < n ? lo + per : n;
  int sum = 0;
  for (int i = lo; i < hi; ++i) sum += v[i];
  tmp[t] = sum;
  __syncthreads();
  for (int off = 1; off < T; off <<= 1) {
    const int add = t >= off ? tmp[t - off] : 0;
    __syncthreads();
    tmp[t] += add;
    __syncthreads();
  }
  int run = tmp[t] - sum;
  const int total = tmp[T - 1];
  for (int i = lo; i < hi; ++i) {
    const int c = v[i];
    v[i] = run;
    run += c;
  }
  __syncthreads();
  return total;
}

// Front: block b's histogram (integer counts: the order of the shared adds
// does not matter).
KOSMOS_DEVICE void MoeLocalOps::route(int b) {
  const TraceSpan span;
  const PlanShape ps = moe_plan_shape(s());
  for (int e = threadIdx.x; e < E(); e += blockDim.x) scratch[e] = 0;
  __syncthreads();
  int first, last;
  plan_block_pairs(ps, b, &first, &last);
  for (int q = first + threadIdx.x; q < last; q += blockDim.x) atomicAdd(scratch + p().indices[q], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < E(); e += blockDim.x) p().hist[(size_t)b * E() + e] = scratch[e];
  if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceIdle, b);
}

// counts[E] then start1[E + 1] in scratch, copied out. The starts are a
// CTA-wide scan: one thread walking E counts pays a dependent latency each.
KOSMOS_DEVICE void MoeLocalOps::scan() {
  const TraceSpan span;
  const int n = E();
  int* start = scratch + n;
  plan_scan(p().hist, moe_plan_shape(s()), scratch, threadIdx.x, blockDim.x);
  __syncthreads();
  for (int e = threadIdx.x; e < n; e += blockDim.x) start[e] = scratch[e];
  __syncthreads();
  const int total = cta_exclusive_scan(start, n, scratch + 2 * n + 1);  // plan_segments<1>
  for (int e = threadIdx.x; e < n; e += blockDim.x) p().ctrl->plan_counts[e] = scratch[e];
  for (int e = threadIdx.x; e < n; e += blockDim.x) p().ctrl->start1[e] = start[e];
  if (threadIdx.x == 0) p().ctrl->start1[n] = total;
  if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceIdle, -1);
}

// Our row of rank d's count table (the release of counts[us] at d follows).
KOSMOS_DEVICE void MoeLocalOps::send_counts(int d) {
  int* row = ctrl_at(d)->table + s().rank * E();
  for (int e = threadIdx.x; e < E(); e += blockDim.x) row[e] = p().ctrl->plan_counts[e];
}

// Block b's pairs in token-major order take the next rows of their experts
// (plan_scatter). Each warp (32-lane group) takes a contiguous chunk of the
// pairs; its cursor per expert is the block's start plus the chunk counts of
// the warps before it (a scan over warps in scratch), and inside the chunk a
// warp ranks 32 pairs at a time: a pair's row is the cursor plus the lanes
// below it with the same expert. So the rows are the serial loop's, in a few
// rounds instead of B*k/32. A round's leader (lowest lane of an expert)
// advances the cursor only after every lane read it, and the next round reads
// it only after that (lanes32_sync). The advanced cursors become the block's ends.
KOSMOS_DEVICE void MoeLocalOps::scatter(int b) {
  static_assert(kMoeThreads / 32 * kMaxExperts <= kMoeScratchInts, "a cursor per warp and expert fits scratch");
  const TraceSpan span;
  int* row0 = p().hist + (size_t)b * E();
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int first, last;
  plan_block_pairs(moe_plan_shape(s()), b, &first, &last);
  const int chunk = (last - first + warps * 32 - 1) / (warps * 32) * 32;
  const int lo = first + warp * chunk, hi = lo + chunk < last ? lo + chunk : last;
  int* cur = scratch + warp * E();  // [warps][E]
  for (int i = threadIdx.x; i < warps * E(); i += blockDim.x) scratch[i] = 0;
  __syncthreads();
  for (int q = lo + lane; q < hi; q += 32) atomicAdd(cur + p().indices[q], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < E(); e += blockDim.x) {
    int run = row0[e];
    for (int w = 0; w < warps; ++w) {
      const int n = scratch[w * E() + e];
      scratch[w * E() + e] = run;
      run += n;
    }
    row0[e] = run;  // the block's end; no one reads row0 before kPlanned
  }
  __syncthreads();
  for (int base = lo; base < hi; base += 32) {
    const int q = base + lane;
    const bool valid = q < hi;
    const int e = valid ? p().indices[q] : -1;
    const unsigned same = lanes32_match(e);
    const int below = __popc(same & ((1u << lane) - 1u));
    const int row = valid ? cur[e] + below : 0;
    lanes32_sync();
    if (valid && below == 0) cur[e] += __popc(same);
    lanes32_sync();
    if (valid) {
      p().pair_row[q] = row;
      p().order[p().ctrl->start1[e] + row] = q;
    }
  }
  if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceIdle, moe_blocks(s()) + b);
}

// moe_build_layout at EP > 1: the exchanged table [ep][E] copied into scratch,
// then walked by thread 0 there (the peers' segments need every source's
// counts of every expert; O(ep * E) shared loads), the layout copied out.
KOSMOS_DEVICE void MoeLocalOps::build_layout_ep() {
  const TraceSpan span;
  const int n = s().ep * E(), words = (int)(sizeof(MoeLayout) / sizeof(int));
  static_assert(kEpMaxRanks * kMaxExperts + sizeof(MoeLayout) / sizeof(int) <= kMoeScratchInts,
                "the table and the layout fit scratch");
  int* table = scratch;
  MoeLayout* L = reinterpret_cast<MoeLayout*>(scratch + kEpMaxRanks * kMaxExperts);
  for (int i = threadIdx.x; i < n; i += blockDim.x) table[i] = p().ctrl->table[i];
  __syncthreads();
  if (threadIdx.x == 0) moe_build_layout(s(), table, L);
  __syncthreads();
  int* to = reinterpret_cast<int*>(&p().ctrl->layout);
  const int* from = reinterpret_cast<const int*>(L);
  for (int i = threadIdx.x; i < words; i += blockDim.x) to[i] = from[i];
  if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceIdle, 2 * moe_blocks(s()));
}

// The table [ep][E] and the layout in scratch, the layout copied out.
// moe_build_layout at EP = 1, CTA-wide: our counts are the whole table, so
// the layout is two exclusive scans over experts (row blocks, packed return
// rows); thread 0 walking it in shared memory took ~55 us at E = 128.
template <bool kPeers>
KOSMOS_DEVICE void MoeLocalOps::build_layout() {
  if (peers<kPeers>()) return build_layout_ep();
  const TraceSpan span;
  const int n = E(), tile = s().tile_m, cap = s().capacity, words = (int)(sizeof(MoeLayout) / sizeof(int));
  MoeLayout* L = reinterpret_cast<MoeLayout*>(scratch);
  int* tmp = scratch + words;  // [blockDim.x + 1]
  if (threadIdx.x == 0) tmp[blockDim.x] = 0;
  __syncthreads();
  for (int x = threadIdx.x; x < n; x += blockDim.x) {
    const int c = p().ctrl->table[x];
    L->src[2 * x] = 0;  // rows of sources before ours (none) and of all sources
    L->src[2 * x + 1] = c;
    L->rb[x] = (c + tile - 1) / tile;
    L->ret[x] = c;
    if (c > cap) tmp[blockDim.x] = 1;  // plan_overflow
  }
  __syncthreads();
  const int blocks = cta_exclusive_scan(L->rb, n, tmp);
  cta_exclusive_scan(L->ret, n, tmp);
  for (int x = threadIdx.x; x < n; x += blockDim.x) L->dst[x] = L->rb[x] * tile;
  if (threadIdx.x == 0) L->rb[n] = blocks, L->dropless = tmp[blockDim.x];
  __syncthreads();
  int* to = reinterpret_cast<int*>(&p().ctrl->layout);
  for (int i = threadIdx.x; i < words; i += blockDim.x) to[i] = scratch[i];
  if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceIdle, 2 * moe_blocks(s()));
}

}  // namespace kosmos::moe
