// The MoE forward megakernel's device operations: the CTA-wide work that
// moe_fwd_cta (moe/fwd_sched.h) asks of its Ops, over the control words of
// moe/fwd_ctl.cuh, single-source CUDA/HIP for any CTA of up to kMoeThreads
// (every step strides by blockDim.x). The GEMM tiles are the engine's
// (build(): moe/fwd_sm90.cuh, moe/fwd_portable.cuh). Routing runs before the
// launch (the router GEMM as XLA ops, the top-k ids by moe/select.cuh), so the
// front's route item is the plan histogram of its block.
//
// Lanes: every per-warp step (the scatter's ranking, the row copies and the
// fold of moe/fwd_rows.cuh) works on groups of 32 lanes (kosmos/platform.h
// lanes32_*): a CUDA warp, or half an AMD wavefront. So `lane = threadIdx.x %
// 32`, `warp = threadIdx.x / 32` and 32-wide strides mean the same on both, and
// a fold group holds one token's k <= 32 rows.
//
// EP = 1: the workspace (moe/fwd_ws.h) holds the control block MoeCtrl and the
// per-row-block words, zeroed by the launcher before every launch (the buffer
// is XLA's, fresh per call), so this launch's epoch is 1. EP > 1: the control
// block, the receive arena and the returned rows are in each rank's symmetric
// heap (moe/fwd_heap.h), where peers push into them; flags hold epochs there,
// never reset. Everything else is written before it is read.
//
// Memory model: a CTA-wide step's threads write (into this GPU's memory or a
// peer's), the CTA barriers, then thread 0 fences and releases (gpu scope for
// our own flags, system scope into a peer's block); a waiter's thread 0
// acquires (system scope for a flag a peer releases) and the CTA barriers
// before anyone reads. Readers through TMA (the engine's producer) acquire
// themselves and fence to the async proxy.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kosmos/sync.h"
#include "kosmos/trace.h"
#include "kosmos/types.h"
#include "moe/fwd_ctl.cuh"
#include "moe/fwd_rows.cuh"
#include "moe/fwd_sched.h"
#include "moe/fwd_ws.h"
#include "tp/heap_use.cuh"

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

// CTA-wide Ops for moe_fwd_cta: every thread calls every member; thread 0
// touches the control words and broadcasts through `bc` (static shared memory).
// `scratch`: dynamic shared memory free outside the engine (kMoeScratchInts).
// Serial steps (prefix sums over experts, the layout) run in it: one thread
// walking E entries of global memory pays a load latency per entry.
//
// kPeers (build_layout, fold; the ops of a kernel forward them): whether the
// kernel's instantiation holds the EP > 1 code at all (the exchanged layout,
// the returned rows' copies; push_unit is EP > 1 only). The Hopper kernels are
// instantiated twice and launched without it at EP = 1: in the one megakernel
// those paths' row-copy loops cost every phase registers, and the dispatch's
// copy loop spilled its loads in flight (sm_90a SASS, 2026-12-04: 166 of the
// forward's 326 spill instructions in moe/fwd_rows.cuh, 3 without them; the
// Qwen3-30B-A3B dispatch 16-1150 us against 70-766 us before EP > 1 existed).
struct MoeLocalOps {
  MoeCtl ctl;
  int* bc;
  int* scratch;

  KOSMOS_DEVICE const MoeFwdParams& p() const { return *ctl.p; }
  KOSMOS_DEVICE const MoeFwdShape& s() const { return ctl.p->s; }
  KOSMOS_DEVICE int E() const { return moe_experts(s()); }
  KOSMOS_DEVICE int bcast(int v) {
    if (threadIdx.x == 0) *bc = v;
    __syncthreads();
    const int r = *bc;
    __syncthreads();
    return r;
  }
  KOSMOS_DEVICE int claim(MoeQueue q) { return bcast(threadIdx.x == 0 ? ctl.claim(q) : 0); }
  KOSMOS_DEVICE bool count(MoeCount k, int i, int target) {
    __syncthreads();  // the CTA's writes before thread 0's acq_rel add
    // At EP > 1 the writes may be a peer's memory (a dispatch part), and the CTA
    // whose add completes the count releases them to that peer: system scope.
    if (threadIdx.x == 0) {
      if (s().ep > 1) __threadfence_system();
      else __threadfence();
    }
    return bcast(threadIdx.x == 0 ? ctl.count(k, i, target) : 0) != 0;
  }
  KOSMOS_DEVICE void release(MoeFlag f, int home, int i) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      ctl.release(f, home, i);
    }
  }
  KOSMOS_DEVICE void wait(MoeFlag f, int i) {
    if (threadIdx.x == 0) ctl.wait(f, i);
    __syncthreads();
  }
  // Threads poll a flag each; each acquires its own, and the barrier orders
  // every acquire before any thread's reads (the same chain as thread 0's wait).
  template <class Pred>
  KOSMOS_DEVICE void wait_each(MoeFlag f, int n, const Pred& pred) {
    const TraceSpan span;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      if (pred(i)) ctl.spin(f, i);
    __syncthreads();
    if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceWait, moe_wait_tile(f, 0xfffff));
  }
  KOSMOS_DEVICE bool test(MoeFlag f, int i) { return bcast(threadIdx.x == 0 ? ctl.test(f, i) : 0) != 0; }
  KOSMOS_DEVICE const int* ends() { return p().hist; }
  KOSMOS_DEVICE const MoeLayout& layout() { return p().ctrl->layout; }
  // Control block of rank d: ours, or a peer's (EP > 1).
  KOSMOS_DEVICE MoeCtrl* ctrl_at(int d) { return d == s().rank ? p().ctrl : p().peer_ctrl[d]; }
  // CTA 0 first: once the last TP+SP writer of our heap's data region has lost
  // its readers (no peer pushes into it before this), every rank may send us
  // this epoch's counts.
  KOSMOS_DEVICE void announce_ready() {
    if (threadIdx.x != 0) return;
    if (p().heap) heap_use_wait(p().heap, p().timeout_ns, {ctl.kernel, s().rank, ctl.cta, "heap_use", 0});
    for (int d = 0; d < s().ep; ++d) ctl.release(MoeFlag::kReady, d, s().rank);
  }
  KOSMOS_DEVICE void finish(int grid) {
    __syncthreads();
    if (threadIdx.x != 0) return;
    MoeCtrl* c = p().ctrl;
    if (add_acq_rel_gpu_u32(&c->finished, 1) != (uint32_t)grid - 1) return;
    for (int q = 0; q < 5; ++q) c->queue[q] = 0;
    c->finished = 0;
    store_release<Scope::kGpu>(&c->epoch, ctl.e);
  }

  // Front: block b's histogram (integer counts: the order of the shared adds
  // does not matter).
  KOSMOS_DEVICE void route(int b) {
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
  // counts[E] then start1[E + 1] in scratch, copied out.
  // counts[E] then start1[E + 1] in scratch, copied out. The starts are a
  // CTA-wide scan: one thread walking E counts pays a dependent latency each.
  KOSMOS_DEVICE void scan() {
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
  KOSMOS_DEVICE void send_counts(int d) {
    int* row = ctrl_at(d)->table + s().rank * E();
    for (int e = threadIdx.x; e < E(); e += blockDim.x) row[e] = p().ctrl->plan_counts[e];
  }
  KOSMOS_DEVICE void scatter(int b);
  // The table [ep][E] and the layout in scratch, the layout copied out.
  // moe_build_layout at EP = 1, CTA-wide: our counts are the whole table, so
  // the layout is two exclusive scans over experts (row blocks, packed return
  // rows); thread 0 walking it in shared memory took ~55 us at E = 128.
  template <bool kPeers>
  KOSMOS_DEVICE bool peers() const {
    return kPeers && s().ep > 1;
  }
  template <bool kPeers = true>
  KOSMOS_DEVICE void build_layout() {
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
  KOSMOS_DEVICE void build_layout_ep();
  KOSMOS_DEVICE void push_part(const MoeMove& m);
  KOSMOS_DEVICE void push_unit(const MoeUnit& c);
  // kStages: the fold's ring depth per warp (moe_fold_warp), as the kernel's
  // shared memory allows.
  template <bool kPeers = true, int kStages = 1>
  KOSMOS_DEVICE void fold(int item, int first, int last);
};

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
