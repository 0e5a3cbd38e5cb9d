// The MoE forward megakernel's control words: the control block (in the
// workspace at EP = 1, moe/fwd_ws.h; in the symmetric heap at EP > 1,
// moe/fwd_heap.h), the launch's parameters, and MoeCtl, the view of them one
// thread has (the engine's producer and publisher threads drive the build
// queue with it; the CTA-wide ops of moe/fwd_ops.cuh wrap it).
//
// Flags hold epochs; counters are u32s re-armed by the add that completes them
// (moe/fwd_sched.h). A flag another rank releases (ready, counts, arrived,
// returned) is stored into that rank's block at system scope and acquired at
// system scope (the writer is another GPU); every other flag and counter is
// this GPU's own, at gpu scope. At EP = 1 every flag is our own.
#pragma once
#include <cstdint>

#include "gemm/tile_hooks.h"
#include "kosmos/queue.h"
#include "kosmos/sync.h"
#include "kosmos/trace.h"
#include "kosmos/types.h"
#include "moe/fwd_heap.h"
#include "moe/fwd_sched.h"
#include "moe/fwd_ws.h"

namespace kosmos::moe {

// A wait span's tile field: the flag in the top bits, its index below
// (benchmarks/moe.py --timeline names them; i = 0xfffff: every flag it needs).
KOSMOS_HD inline int moe_wait_tile(MoeFlag f, int i) { return (int)f << 20 | (i & 0xfffff); }

// The Hopper engine's CTA, the largest the CTA-wide ops run in (the portable
// engine's is 256): they stride by blockDim.x, and the scatter's cursors per
// warp and expert in scratch are sized for this many warps.
constexpr int kMoeThreads = 384;

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
  uint32_t x_parts[kMaxExperts];           // MoeCount kXParts [ep * E_l] (the backward at EP > 1)
  uint64_t x_arrived[kMaxExperts];         // [ep * E_l]
  int plan_counts[kMaxExperts];            // [E] this rank's pairs per expert
  int start1[kMaxExperts + 1];             // packed segment starts (plan_segments<1>)
  int table[kEpMaxRanks * kMaxExperts];    // [ep][E] exchanged counts
  MoeLayout layout;
};
static_assert(sizeof(MoeCtrl) <= kMoeCtrlBytes, "the control block fits its workspace section");
static_assert(sizeof(MoeCtrl) <= kMoeCtrlStride, "the control block fits its heap slot");
// The front's shared scratch (ints). Its largest use is the scatter's cursor
// per warp and expert (kMoeThreads / 32 * E); the layout takes a MoeLayout and
// a scan buffer of a CTA's threads, the scan 2E + 1 and that buffer.
constexpr int kMoeScratchInts = kEpMaxRanks * kMaxExperts + (int)(sizeof(MoeLayout) / sizeof(int));

struct MoeFwdParams {
  MoeFwdShape s;          // ep == 1; s.shared_rb0 = R / tile_m, s.shared_blocks = S / tile_m
  int H, I;
  const bf16_t* x;        // [t][H]
  const int* indices;     // [t*k] expert of each pair (routing.indices)
  const float* weights;   // [t*k] fp32 combine weights
  bf16_t* y;              // [t][H]
  int* pair_row;          // [t*k] the plan's pos, then (the fold) the pair's row of y_rows
  bf16_t* hs;             // [t][2I] the shared expert's pre-activations (bf16, gate | up), or nullptr
  int input_gating;       // rows sent are w * x and fold with weight 1 (Llama 4)
  MoeCtrl* ctrl;
  uint64_t* rb_flags;     // [2][rbs] GEMM1, GEMM2 row-block flags
  uint32_t* rb_counts;    // [2][rbs]
  int rbs;                // row blocks of act and y_rows: (R + S) / tile_m
  int* hist;              // [nb][E] plan_scan's starts, then each block's ends
  int* order;             // [t*k] pairs in the packed plan order
  bf16_t* arena;          // [R][H] the experts' input rows
  bf16_t* act;            // [R + S][I] SwiGLU outputs
  bf16_t* h1;             // [R][2I] routed pre-activations (bf16, gate | up), kept for the backward;
                          // null: a forward no backward reads (e.g. inference) keeps none, nor hs
  bf16_t* y_rows;         // [R + S + P][H] the experts' output rows (the shared expert's after
                          // ours, then, at EP > 1, copies of the rows our pairs got back)
  // EP > 1: the group's blocks by rank, each in its rank's heap (moe/fwd_heap.h):
  // control blocks, receive arenas (ours is `arena`) and returned rows.
  MoeCtrl* peer_ctrl[kEpMaxRanks];
  bf16_t* peer_arena[kEpMaxRanks];
  bf16_t* peer_ret[kEpMaxRanks];
  char* heap;             // our heap, whose HeapUse CTA 0 waits on (nullptr at EP = 1)
  // The backward at EP > 1 (s.x_parts): the forward's input x [t][H], pushed as
  // each owner's X rows (peer_xrows[d]: d's [R][H] X arena in its heap; ours is
  // the one wgrad1 reads), scaled as the forward's arena rows were.
  const bf16_t* x_fwd;
  bf16_t* peer_xrows[kEpMaxRanks];
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
  const char* kernel = "moe_forward";  // what a wait's timeout report names: the backward's says so

  // Whether another rank releases flag f (so it is acquired at system scope).
  KOSMOS_DEVICE static bool cross(MoeFlag f) {
    return f == MoeFlag::kReady || f == MoeFlag::kCounts || f == MoeFlag::kArrived || f == MoeFlag::kReturned ||
           f == MoeFlag::kXArrived;
  }
  KOSMOS_DEVICE bool sys(MoeFlag f) const { return p->s.ep > 1 && cross(f); }
  KOSMOS_DEVICE uint64_t* flag(MoeFlag f, int i) const { return flag_at(p->ctrl, f, i); }
  // Flag i in control block c (ours, or a peer's for a cross-rank release).
  KOSMOS_DEVICE uint64_t* flag_at(MoeCtrl* c, MoeFlag f, int i) const {
    switch (f) {
      case MoeFlag::kReady: return c->ready + i;
      case MoeFlag::kCounts: return c->counts + i;
      case MoeFlag::kScanned: return &c->scanned;
      case MoeFlag::kPlanned: return &c->planned;
      case MoeFlag::kLaidOut: return &c->laid_out;
      case MoeFlag::kArrived: return c->arrived + i;
      case MoeFlag::kGemm1: return p->rb_flags + i;
      case MoeFlag::kGemm2: return p->rb_flags + p->rbs + i;
      case MoeFlag::kXArrived: return c->x_arrived + i;
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
      case MoeCount::kXParts: return c->x_parts + i;
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
  // Flag i at rank `home`: a peer's at system scope, after the caller's barrier
  // (the release is cumulative over the CTA's stores into that peer).
  KOSMOS_DEVICE void release(MoeFlag f, int home, int i) {
    if (home == p->s.rank) store_release<Scope::kGpu>(flag(f, i), e);
    else store_release<Scope::kSys>(flag_at(p->peer_ctrl[home], f, i), e);
  }
  KOSMOS_DEVICE uint64_t acquire(MoeFlag f, int i) const {
    return sys(f) ? load_acquire<Scope::kSys>(flag(f, i)) : load_acquire<Scope::kGpu>(flag(f, i));
  }
  // One poll loop whatever the scope (one timeout report per wait site: HIP's
  // resource bounds, tests/hip/resource_bounds.txt, count them).
  KOSMOS_DEVICE void spin(MoeFlag f, int i) const {
    const uint64_t* fl = flag(f, i);
    const bool at_sys = sys(f);
    const uint64_t start = now_ns();
    for (uint32_t n = 1;; ++n) {
      const uint64_t seen = at_sys ? load_acquire<Scope::kSys>(fl) : load_acquire<Scope::kGpu>(fl);
      if (seen >= e) return;
      if ((n & 255u) == 0 && now_ns() - start > p->timeout_ns)
        timeout_trap({kernel, p->s.rank, cta, moe_flag_name(f), i}, e, seen, p->timeout_ns);
    }
  }
  // Thread 0 only (the CTA-wide ops' thread, and the Hopper engine's producer).
  KOSMOS_DEVICE void wait(MoeFlag f, int i) {
    // A traced build records only waits that spin: the backward's weight-gradient
    // tiles test every row block of their expert, ~10^6 ready flags in a DeepSeek-V3
    // launch, which overflowed the per-CTA record buffers.
    if (kTraceCompiled && test(f, i)) return;
    const TraceSpan span;
    spin(f, i);
    span.close(p->trace, cta, kTraceWait, moe_wait_tile(f, i));
  }
  KOSMOS_DEVICE bool test(MoeFlag f, int i) { return acquire(f, i) >= e; }
};

// The control words of a row block's tile on the Hopper engine, the part its
// hooks share in both directions (the forward's GEMM1 / GEMM2, the backward's
// dgrad2 / dgrad1: Builds is MoeBuilds or MoeBwdBuilds): the producer waits
// for the rows the tile reads, then fences so that TMA sees them; the
// publisher counts the tile once its stores are complete.
template <class Builds, int kKind>
struct MoeRowTileCtl {
  Builds* b;

  KOSMOS_DEVICE int expert(gemm::TileCoord t) const { return moe_tile_expert(b->s, b->L, t.m); }
  KOSMOS_DEVICE bool shared(gemm::TileCoord t) const { return moe_shared_rb(b->s, t.m); }
  KOSMOS_DEVICE void before_tile(gemm::TileCoord t) {
    b->start(MoeTile{kKind, t.m, expert(t), t.n});
  }
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(gemm::TileCoord t) { b->done(MoeTile{kKind, t.m, 0, t.n}); }
};

}  // namespace kosmos::moe
