// The MoE forward megakernel's device operations at EP = 1 (one rank, no
// peers): the control words and the CTA-wide work that moe_fwd_cta
// (moe/fwd_sched.h) asks of its Ops, on any CUDA GPU. The GEMM tiles are the
// engine's (moe/fwd_sm90.cuh adds build()). Routing runs before the launch
// (the router GEMM and top-k as XLA ops), so the front's route item is the plan
// histogram of its block.
//
// Workspace (moe/fwd_ws.h): the control block MoeCtrl and the per-row-block
// words are zeroed by the launcher before every launch (the buffer is XLA's,
// fresh per call), so this launch's epoch is 1; everything else is written
// before it is read.
//
// Memory model: a CTA-wide step's threads write, the CTA barriers, then thread
// 0 fences and releases (gpu scope: every reader is on this GPU); a waiter's
// thread 0 acquires and the CTA barriers before anyone reads. Readers through
// TMA (the engine's producer) acquire themselves and fence to the async proxy.
#pragma once
#include <cstdint>

#include "kosmos/queue.h"
#include "kosmos/sync.h"
#include "kosmos/trace.h"
#include "kosmos/types.h"
#include "moe/fwd_rows.cuh"
#include "moe/fwd_sched.h"
#include "moe/fwd_ws.h"

namespace kosmos::moe {

constexpr int kMoeThreads = 384;  // the Hopper engine's CTA: every CTA-wide step uses all of them

struct MoeCtrl {
  uint64_t epoch;                          // last epoch completed (0 after the launcher's memset)
  uint32_t queue[5];                       // by MoeQueue
  uint32_t finished;
  uint32_t routed, scattered;              // MoeCount kRouted, kScattered
  uint32_t parts[kMaxExperts];             // MoeCount kParts [ep * E_l]
  uint64_t ready[kEpMaxRanks], counts[kEpMaxRanks];
  uint64_t scanned, planned, laid_out;
  uint64_t arrived[kMaxExperts];           // [ep * E_l]
  uint64_t returned[kMaxExperts];          // [E]
  int plan_counts[kMaxExperts];            // [E] this rank's pairs per expert
  int start1[kMaxExperts + 1];             // packed segment starts (plan_segments<1>)
  int table[kEpMaxRanks * kMaxExperts];    // [ep][E] exchanged counts
  MoeLayout layout;
};
static_assert(sizeof(MoeCtrl) <= kMoeCtrlBytes, "the control block fits its workspace section");
// The front's shared scratch (ints): the exchanged table and a MoeLayout built
// beside it (the largest use; routing and the scan need 2E + 1).
constexpr int kMoeScratchInts = kEpMaxRanks * kMaxExperts + (int)(sizeof(MoeLayout) / sizeof(int));

struct MoeFwdParams {
  MoeFwdShape s;          // ep == 1
  int H, I;
  const bf16_t* x;        // [t][H]
  const int* indices;     // [t*k] expert of each pair (routing.indices)
  const float* weights;   // [t*k] fp32 combine weights
  const float* y0;        // [t][H] fp32 added before rounding (the shared expert), or nullptr
  bf16_t* y;              // [t][H]
  int* pair_row;          // [t*k] the plan's pos, then (the fold) the pair's row of y_rows
  int input_gating;       // rows sent are w * x and fold with weight 1 (Llama 4)
  MoeCtrl* ctrl;
  uint64_t* rb_flags;     // [2][rbs] GEMM1, GEMM2 row-block flags
  uint32_t* rb_counts;    // [2][rbs]
  int rbs;                // row blocks of the arena (R / tile_m)
  int* hist;              // [nb][E] plan_scan's starts, then each block's ends
  int* order;             // [t*k] pairs in the packed plan order
  bf16_t* arena;          // [R][H] the experts' input rows
  bf16_t* act;            // [R][I] SwiGLU outputs
  bf16_t* y_rows;         // [R][H] the experts' output rows
  int movers, switching;
  uint64_t timeout_ns;
  TraceBuf trace;         // role timeline (KOSMOS_TRACE builds; records == nullptr: off)
};

// The control words as one thread sees them: what the engine's producer and
// publisher threads drive MoeBuilds with, and what the CTA-wide ops wrap.
struct MoeCtl {
  const MoeFwdParams* p;
  uint64_t e;
  int cta;

  KOSMOS_DEVICE uint64_t* flag(MoeFlag f, int i) const {
    MoeCtrl* c = p->ctrl;
    switch (f) {
      case MoeFlag::kReady: return c->ready + i;
      case MoeFlag::kCounts: return c->counts + i;
      case MoeFlag::kScanned: return &c->scanned;
      case MoeFlag::kPlanned: return &c->planned;
      case MoeFlag::kLaidOut: return &c->laid_out;
      case MoeFlag::kArrived: return c->arrived + i;
      case MoeFlag::kGemm1: return p->rb_flags + i;
      case MoeFlag::kGemm2: return p->rb_flags + p->rbs + i;
      default: return c->returned + i;
    }
  }
  KOSMOS_DEVICE uint32_t* counter(MoeCount k, int i) const {
    MoeCtrl* c = p->ctrl;
    switch (k) {
      case MoeCount::kRouted: return &c->routed;
      case MoeCount::kScattered: return &c->scattered;
      case MoeCount::kParts: return c->parts + i;
      case MoeCount::kGemm1: return p->rb_counts + i;
      default: return p->rb_counts + p->rbs + i;
    }
  }
  KOSMOS_DEVICE int claim(MoeQueue q) { return (int)WorkQueue{p->ctrl->queue + (int)q, 0}.claim(); }
  // The add that completes the count re-arms it (nothing adds to it again this epoch).
  KOSMOS_DEVICE bool count(MoeCount k, int i, int target) {
    uint32_t* c = counter(k, i);
    if (add_acq_rel_gpu_u32(c, 1) + 1 != (uint32_t)target) return false;
    *c = 0;
    return true;
  }
  KOSMOS_DEVICE void release(MoeFlag f, int, int i) { store_release<Scope::kGpu>(flag(f, i), e); }
  // Thread 0 only (the CTA-wide ops' thread, and the Hopper engine's producer).
  KOSMOS_DEVICE void wait(MoeFlag f, int i) {
    const TraceSpan span;
    wait_ge<Scope::kGpu>(flag(f, i), e, p->timeout_ns, {"moe_forward", p->s.rank, cta, moe_flag_name(f), i});
    span.close(p->trace, cta, kTraceWait, i);
  }
  KOSMOS_DEVICE bool test(MoeFlag f, int i) { return load_acquire<Scope::kGpu>(flag(f, i)) >= e; }
};

// CTA-wide Ops for moe_fwd_cta: every thread calls every member; thread 0
// touches the control words and broadcasts through `bc` (static shared memory).
// `scratch`: dynamic shared memory free outside the engine (kMoeScratchInts).
// Serial steps (prefix sums over experts, the layout) run in it: one thread
// walking E entries of global memory pays a load latency per entry.
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
    if (threadIdx.x == 0) __threadfence();
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
      if (pred(i))
        wait_ge<Scope::kGpu>(ctl.flag(f, i), ctl.e, p().timeout_ns, {"moe_forward", s().rank, ctl.cta, moe_flag_name(f), i});
    __syncthreads();
    if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceWait, -1);
  }
  KOSMOS_DEVICE bool test(MoeFlag f, int i) { return bcast(threadIdx.x == 0 ? ctl.test(f, i) : 0) != 0; }
  KOSMOS_DEVICE const int* ends() { return p().hist; }
  KOSMOS_DEVICE const MoeLayout& layout() { return p().ctrl->layout; }
  KOSMOS_DEVICE void announce_ready() {
    if (threadIdx.x == 0) ctl.release(MoeFlag::kReady, 0, s().rank);
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
  KOSMOS_DEVICE void scan() {
    const TraceSpan span;
    plan_scan(p().hist, moe_plan_shape(s()), scratch, threadIdx.x, blockDim.x);
    __syncthreads();
    if (threadIdx.x == 0) plan_segments<1>(scratch, E(), scratch + E());
    __syncthreads();
    for (int e = threadIdx.x; e < E(); e += blockDim.x) p().ctrl->plan_counts[e] = scratch[e];
    for (int e = threadIdx.x; e <= E(); e += blockDim.x) p().ctrl->start1[e] = scratch[E() + e];
    if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceIdle, -1);
  }
  KOSMOS_DEVICE void send_counts(int d) {
    for (int e = threadIdx.x; e < E(); e += blockDim.x) p().ctrl->table[d * E() + e] = p().ctrl->plan_counts[e];
  }
  KOSMOS_DEVICE void scatter(int b);
  // The table [ep][E] and the layout in scratch, the layout copied out.
  KOSMOS_DEVICE void build_layout() {
    const int n = s().ep * E(), words = (int)(sizeof(MoeLayout) / sizeof(int));
    MoeLayout* L = reinterpret_cast<MoeLayout*>(scratch + n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) scratch[i] = p().ctrl->table[i];
    __syncthreads();
    if (threadIdx.x == 0) moe_build_layout(s(), scratch, L);
    __syncthreads();
    int* to = reinterpret_cast<int*>(&p().ctrl->layout);
    for (int i = threadIdx.x; i < words; i += blockDim.x) to[i] = scratch[n + i];
  }
  KOSMOS_DEVICE void push_part(const MoeMove& m);
  // EP = 1: every unit is our own (its rows stay in the arena), so the
  // schedule never pushes one; the launcher refuses ep > 1.
  KOSMOS_DEVICE void push_unit(const MoeUnit&) { trap(); }
  KOSMOS_DEVICE void fold(int item, int first, int last);
};

// Block b's pairs in token-major order take the next rows of their experts
// (plan_scatter), one warp ranking 32 pairs at a time: a pair's row is the
// expert's cursor plus the lanes below it with the same expert, so the rows
// are the serial loop's. The advanced cursors become the block's ends.
KOSMOS_DEVICE void MoeLocalOps::scatter(int b) {
  const TraceSpan span;
  const PlanShape ps = moe_plan_shape(s());
  int* row0 = p().hist + (size_t)b * E();
  for (int e = threadIdx.x; e < E(); e += blockDim.x) scratch[e] = row0[e];
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int first, last;
    plan_block_pairs(ps, b, &first, &last);
    for (int base = first; base < last; base += 32) {
      const int q = base + lane;
      const bool valid = q < last;
      const int e = valid ? p().indices[q] : -1;
      const unsigned same = __match_any_sync(0xffffffffu, e);
      const int below = __popc(same & ((1u << lane) - 1u));
      const int row = valid ? scratch[e] + below : 0;
      __syncwarp();
      if (valid && below == 0) scratch[e] += __popc(same);
      __syncwarp();
      if (valid) {
        p().pair_row[q] = row;
        p().order[p().ctrl->start1[e] + row] = q;
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E(); e += blockDim.x) row0[e] = scratch[e];
  if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceIdle, moe_blocks(s()) + b);
}

// Dispatch part m at EP = 1: our rows for expert m.x from token group m.g,
// gathered into their arena rows (a warp per row, moe_copy_row). Input gating
// sends bf16(w * x), the twin's rounding of the scaled row.
KOSMOS_DEVICE void MoeLocalOps::push_part(const MoeMove& m) {
  const TraceSpan span;
  const int ex = m.dst * s().e_local + m.x, k = s().top_k, H = p().H;
  int begin, end;
  moe_part_rows(s(), ends(), m, &begin, &end);
  const int at = layout().dst[ex], start = p().ctrl->start1[ex];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = begin + warp; r < end; r += blockDim.x / 32) {
    const int q = p().order[start + r];
    const uint4* from = reinterpret_cast<const uint4*>(p().x + (size_t)(q / k) * H);
    uint4* to = reinterpret_cast<uint4*>(p().arena + (size_t)(at + r) * H);
    moe_copy_row(from, to, H / 8, lane, p().input_gating != 0, p().input_gating ? p().weights[q] : 1.f);
  }
  __syncthreads();
  if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceMove, (m.x * s().groups + m.g) * s().ep + m.dst);
}

// Fold item: tokens [first, last), a warp per token (moe_fold_row). Also
// turns each pair's pos into its row of y_rows (pair_row, for the backward).
KOSMOS_DEVICE void MoeLocalOps::fold(int item, int first, int last) {
  const TraceSpan span;
  const int k = s().top_k, H = p().H;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int tok = first + warp; tok < last; tok += blockDim.x / 32) {
    const int* idx = p().indices + (size_t)tok * k;
    int row = 0;
    float wt = 0.f;
    if (lane < k) {
      int* pr = p().pair_row + (size_t)tok * k + lane;
      row = moe_pair_row(s(), layout(), p().ctrl->start1, idx[lane], *pr).row;
      *pr = row;
      wt = p().input_gating ? 1.f : p().weights[(size_t)tok * k + lane];
    }
    const float* y0 = p().y0 != nullptr ? p().y0 + (size_t)tok * H : nullptr;
    bf16_t* y = p().y + (size_t)tok * H;
    if (k >= 4) moe_fold_row<1>(p().y_rows, y0, y, H, k, row, wt, lane);
    else if (k >= 2) moe_fold_row<2>(p().y_rows, y0, y, H, k, row, wt, lane);
    else moe_fold_row<4>(p().y_rows, y0, y, H, k, row, wt, lane);
  }
  __syncthreads();
  if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceReduce, item);
}

}  // namespace kosmos::moe
