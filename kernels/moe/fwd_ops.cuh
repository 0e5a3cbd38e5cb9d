// The MoE forward megakernel's device operations: the CTA-wide work that
// moe_fwd_cta (moe/fwd_sched.h) asks of its Ops, over the control words of
// moe/fwd_ctl.cuh, single-source CUDA/HIP for any CTA of up to kMoeThreads
// (every step strides by blockDim.x). The GEMM tiles are the engine's
// (build(): moe/fwd_sm90.cuh, moe/fwd_portable.cuh). Routing runs before the
// launch (the router GEMM as XLA ops, the top-k ids by moe/select.cuh), so the
// front's route item is the plan histogram of its block. This file: the Ops
// struct and its control members (claims, counts, flags); the plan's steps are
// defined in moe/fwd_plan_ops.cuh, the row traffic in moe/fwd_move_ops.cuh,
// both included at the end.
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
#include "moe/fwd_sched.h"
#include "moe/fwd_ws.h"
#include "tp/heap_use.cuh"

namespace kosmos::moe {

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
  // The layout for the rest of the CTA's life, once the front has waited for
  // it (CTA-wide): layout() itself here; the Hopper ops' copy in shared memory
  // (moe/sm90_ops.cuh).
  KOSMOS_DEVICE const MoeLayout& local_layout() { return layout(); }
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

  // The plan's steps (moe/fwd_plan_ops.cuh).
  KOSMOS_DEVICE void route(int b);
  KOSMOS_DEVICE void scan();
  KOSMOS_DEVICE void send_counts(int d);
  KOSMOS_DEVICE void scatter(int b);
  template <bool kPeers>
  KOSMOS_DEVICE bool peers() const {
    return kPeers && s().ep > 1;
  }
  template <bool kPeers = true>
  KOSMOS_DEVICE void build_layout();
  KOSMOS_DEVICE void build_layout_ep();
  // The row traffic (moe/fwd_move_ops.cuh).
  KOSMOS_DEVICE void push_part(const MoeMove& m);
  KOSMOS_DEVICE void push_unit(const MoeUnit& c);
  // kStages: the fold's ring depth per warp (moe_fold_warp), as the kernel's
  // shared memory allows.
  template <bool kPeers = true, int kStages = 1>
  KOSMOS_DEVICE void fold(int item, int first, int last);
};

}  // namespace kosmos::moe

// The members defined out of the struct.
#include "moe/fwd_move_ops.cuh"
#include "moe/fwd_plan_ops.cuh"
