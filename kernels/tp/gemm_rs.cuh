// Fused GEMM + reduce-scatter (paper §3.2.2): Y = reduce_scatter_rows(X @ W) in
// one persistent launch, one-shot pull. Builders compute fp32 partial tiles of
// X @ W into this rank's staging buffer in band-major order and publish each
// completed band; reducers pull band b of our own chunk from every rank, sum the
// ranks in fixed order in fp32 and round once into Y. The schedule (queues,
// roles, deadlock freedom) is tp/rs_sched.h, shared with the CPU emulation;
// this file supplies its device operations. The Hopper life may push instead
// (RsShape::push, gemm_rs_sm90.cuh): builders write partials into their owner's
// staging; these portable builders and reducers pull only.
//
// Arrival is signalled by flags (pub[] epochs), not by a NaN sentinel in the
// data as in the paper: the portable engine stores plain fp32, and an epoch flag
// costs one release per band rather than a staging refill per launch.
#pragma once
#include <cstddef>
#include <cstdint>

#include "gemm/portable/tile_gemm.cuh"
#include "kosmos/cta.h"
#include "kosmos/platform.h"
#include "kosmos/queue.h"
#include "kosmos/sync.h"
#include "kosmos/trace.h"
#include "kosmos/types.h"
#include "tp/heap_use.cuh"
#include "tp/rs_layout.h"
#include "tp/rs_sched.h"

namespace kosmos {

// One staged fp32 partial tile: kBM x tile_n (the builders' tile width), row-major.
// Rows and columns past the problem are never read back (the portable builders
// store zeros there, the Hopper builders skip them).
KOSMOS_HD inline size_t rs_tile_elems(int tile_n) { return (size_t)portable::kBM * tile_n; }

// elem_bytes: 4 for fp32 staging, 2 for bf16 (Hopper builders only).
KOSMOS_HD inline size_t rs_stage_bytes(const RsShape& s, int tile_n, int elem_bytes = 4) {
  return (size_t)rs_n_build(s) * rs_tile_elems(tile_n) * elem_bytes;
}

template <typename T>
struct RsParams {
  const T* x;  // [tp * rows, K]: chunk c (rank c's output) is rows [c*rows, (c+1)*rows)
  const T* w;  // [K, N]
  T* y;        // [rows, N]: our chunk of the sum over ranks
  char* heap[kMaxRanks];  // every rank's heap base, mapped here
  int rank, tp, rows, K, N;
  int tile_n;      // builders' tile width: portable::kBN, or the Hopper engine's kBN
  int stage_bf16;  // 1: bf16 staging (Hopper builders only), 0: fp32
  RsShape shape;
  int reducers;
  int switching;  // 0: builders stop when the GEMM queue is empty (fixed split; 1 <= reducers <= grid - 1)
  size_t ctrl_off;  // this group's RS control block: rs_ctrl_offset(slot), same on every rank
  uint64_t timeout_ns;
  TraceBuf trace;   // role timeline (KOSMOS_TRACE builds; records == nullptr: off)
};

struct RsShared {
  portable::TileSmem tile;
  int bcast;
};

// Shared: the CTA's shared state, with at least `int bcast` (claims) and, for
// the portable build(), `portable::TileSmem tile`.
template <typename T, class Shared = RsShared>
struct RsDeviceOps {
  const RsParams<T>& p;
  Shared& sm;
  RsCtrl* ctrl;
  uint64_t epoch;
  bool data_free;  // this CTA has seen the data region's last readers finish

  KOSMOS_DEVICE RsCtrl* ctrl_of(int r) const { return reinterpret_cast<RsCtrl*>(p.heap[r] + p.ctrl_off); }
  // Rank r's staged tile `slot` (rs_stage_slot): kBM x tile_n elements of E
  // (fp32, or bf16 for Hopper builders staging bf16).
  template <class E = float>
  KOSMOS_DEVICE E* stage(int r, int slot) const {
    return reinterpret_cast<E*>(p.heap[r] + kHeapDataOffset) + (size_t)slot * rs_tile_elems(p.tile_n);
  }
  KOSMOS_DEVICE WaitSite site(const char* flag, int i) const { return {"tn_rs", p.rank, (int)blockIdx.x, flag, i}; }
  KOSMOS_DEVICE int bcast(int v) { return cta_bcast(&sm.bcast, v); }
  KOSMOS_DEVICE WorkQueue build_q() const { return WorkQueue{&ctrl->build_next, 0}; }

  KOSMOS_DEVICE int claim_build() { return bcast(threadIdx.x == 0 ? (int)build_q().claim() : 0); }
  KOSMOS_DEVICE bool build_claimed(int j) { return bcast(threadIdx.x == 0 ? (int)build_q().claimed((uint32_t)j) : 0); }
  KOSMOS_DEVICE int claim_reduce() {
    return bcast(threadIdx.x == 0 ? (int)WorkQueue{&ctrl->reduce_next, 0}.claim() : 0);
  }
  // Peers read step_claimed[] before waiting on our bands (sys scope: remote reads).
  KOSMOS_DEVICE void mark_step_claimed(int b) {
    if (threadIdx.x == 0) store_release<Scope::kSys>(&ctrl->step_claimed[b], epoch);
  }
  // The schedule asks for each peer; HeapUse answers for all of them (and for a
  // previous launch of another op) at once.
  KOSMOS_DEVICE void wait_peer_done(int) { guard_data(); }
  KOSMOS_DEVICE void guard_data() { heap_use_guard(data_free, p.heap[p.rank], p.timeout_ns, site("done(last use)", 0)); }
  // The barrier puts every thread's staging stores before thread 0's acq_rel add,
  // so the CTA that completes the band has acquired the whole band.
  KOSMOS_DEVICE uint32_t band_add(int b, int c) {
    __syncthreads();
    return (uint32_t)bcast(
        threadIdx.x == 0 ? (int)add_acq_rel_gpu_u32(&ctrl->band_count[rs_flag_index(b, c)], 1) : 0);
  }
  KOSMOS_DEVICE void publish(int b, int c) {
    if (threadIdx.x == 0) store_release<Scope::kSys>(&ctrl->pub[rs_flag_index(b, c)], epoch);
  }
  KOSMOS_DEVICE void wait_step_claimed(int src, int b) {
    if (threadIdx.x == 0) {
      const TraceSpan wait;
      wait_ge<Scope::kSys>(&ctrl_of(src)->step_claimed[b], epoch, p.timeout_ns, site("step_claimed", src * kRsMaxBands + b));
      wait.close(p.trace, blockIdx.x, kTraceWait, b);
    }
    __syncthreads();
  }
  // Band b of our chunk as rank src built it (staged at src, or pushed here):
  // every thread's loads of it are ordered after thread 0's acquire by the barrier.
  KOSMOS_DEVICE void wait_band(int src, int b) {
    if (threadIdx.x == 0) {
      const TraceSpan wait;
      const RsStaged h = rs_staged(p.shape, src, p.rank);
      wait_ge<Scope::kSys>(&ctrl_of(h.home)->pub[rs_flag_index(b, h.pos)], epoch, p.timeout_ns,
                           site("pub", src * kRsMaxBands + b));
      wait.close(p.trace, blockIdx.x, kTraceWait, b);
    }
    __syncthreads();
  }
  // Push transport: our staging may take the peers' partials of this epoch once
  // its last readers are done; a remote store, so the peers poll locally.
  KOSMOS_DEVICE void announce_ready() {
    guard_data();
    if (threadIdx.x == 0)
      for (int r = 0; r < p.tp; ++r)
        if (r != p.rank) store_release<Scope::kSys>(&ctrl_of(r)->ready[p.rank], epoch);
  }
  KOSMOS_DEVICE void build(const RsTile& t);
  KOSMOS_DEVICE void reduce(const RsSlice& sl);
  KOSMOS_DEVICE void finish(int grid);
};

// Partial tile t of chunk t.chunk: rows of that chunk's tile row times W's tile
// column, stored whole into the staging slot rs_stage_slot() names.
template <typename T, class Shared>
KOSMOS_DEVICE void RsDeviceOps<T, Shared>::build(const RsTile& t) {
  guard_data();  // also covers tp == 1, where the schedule never asks for peers
  const TraceSpan span;
  const RsShape& s = p.shape;
  const int tr = t.band * s.R + t.k / s.NT, tn = t.k % s.NT;
  const int r0 = tr * portable::kBM;
  const int rows = min(portable::kBM, p.rows - r0);
  const T* a = p.x + ((size_t)t.chunk * p.rows + r0) * p.K;
  portable::Acc acc;
  portable::tile_mma(a, rows, p.w, p.K, p.N, tn * portable::kBN, sm.tile, acc);
  const int slot = rs_stage_slot(s, t.band, t.chunk, t.k);
  portable::tile_store(acc, stage(p.rank, slot), portable::kBM, portable::kBN, 0, [](int r) { return r; });
  if (threadIdx.x == 0) span.close(p.trace, blockIdx.x, kTraceBuild, slot);
}

// Sums the slice's tiles over ranks 0..tp-1 in that order (rs_reduce_fixed),
// threads splitting the elements; L2-only loads, since peers and other CTAs
// wrote the staging during this launch. Rounded once into Y.
template <typename T, class Shared>
KOSMOS_DEVICE void RsDeviceOps<T, Shared>::reduce(const RsSlice& sl) {
  const TraceSpan span;
  const RsShape& s = p.shape;
  for (int k = sl.k0; k < sl.k0 + sl.n; ++k) {
    const int slot = rs_stage_slot(s, sl.band, p.rank, k);
    const int bn = p.tile_n;
    const int row0 = (sl.band * s.R + k / s.NT) * portable::kBM, col0 = (k % s.NT) * bn;
    const int rows = min(portable::kBM, p.rows - row0), cols = min(bn, p.N - col0);
    auto inside = [=](uint32_t i) { return (int)(i / bn) < rows && (int)(i % bn) < cols; };
    auto src = [&](int r, uint32_t i) { return inside(i) ? load_cg_elem(stage(r, slot) + i) : 0.f; };
    auto dst = [&](uint32_t i, float sum) {
      if (inside(i)) p.y[(size_t)(row0 + i / bn) * p.N + col0 + i % bn] = from_f32<T>(sum);
    };
    rs_reduce_fixed(p.tp, (uint32_t)rs_tile_elems(bn), threadIdx.x, blockDim.x, src, dst);
  }
  if (threadIdx.x == 0) span.close(p.trace, blockIdx.x, kTraceReduce, rs_stage_slot(s, sl.band, p.rank, sl.k0));
}

// The last CTA to finish tells every peer we are done reading its staging for
// this epoch, records this launch as the data region's last writer, resets the
// local counters and advances the epoch: no host work between launches.
template <typename T, class Shared>
KOSMOS_DEVICE void RsDeviceOps<T, Shared>::finish(int grid) {
  if (!last_cta_done(&ctrl->finished, grid)) return;
  release_peers(p.heap, p.ctrl_off + offsetof(RsCtrl, done), epoch, p.tp, p.rank);
  const int bands = rs_bands(p.shape);
  for (int b = 0; b < bands; ++b)
    for (int c = 0; c < p.tp; ++c) ctrl->band_count[rs_flag_index(b, c)] = 0;
  ctrl->build_next = 0;
  ctrl->reduce_next = 0;
  ctrl->finished = 0;
  store_release<Scope::kGpu>(&ctrl->epoch, epoch);
}

// Dynamic shared memory is only padding: it makes two CTAs never fit on one SM.
template <typename T>
__global__ void __launch_bounds__(portable::kThreads, 1) tn_rs_kernel(const RsParams<T> p) {
  __shared__ RsShared sm;
  RsCtrl* ctrl = reinterpret_cast<RsCtrl*>(p.heap[p.rank] + p.ctrl_off);
  const uint64_t epoch = launch_epoch(&ctrl->epoch);
  RsDeviceOps<T> ops{p, sm, ctrl, epoch, false};
  rs_cta(ops, p.shape, (int)blockIdx.x, (int)gridDim.x, p.reducers, p.switching != 0);
}

}  // namespace kosmos
