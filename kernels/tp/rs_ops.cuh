// GEMM + reduce-scatter's device operations (paper §3.2.2), shared by its
// portable builders (tp/gemm_rs.cuh) and its Hopper builders
// (tp/gemm_rs_sm90.cuh): the launch parameters, the staging's addressing,
// RsDeviceOps (the flags the schedule waits on, the reducers, the end of a
// launch) and RsSched, the GEMM tile claims. The schedule (queues, roles, the
// one CTA life rs_cta, deadlock freedom) is tp/rs_sched.h, shared with the CPU
// emulation. The transport is a template parameter (Tr) of the schedule and
// of RsDeviceOps, as the kernel's.
//
// Arrival is signalled by flags (pub[] epochs), not by a NaN sentinel in the
// data as in the paper: the portable engine stores plain fp32, and an epoch flag
// costs one release per band rather than a staging refill per launch.
#pragma once
#include <cstddef>
#include <cstdint>

#include "gemm/tile_problem.h"
#include "kosmos/cta.h"
#include "kosmos/platform.h"
#include "kosmos/pull.h"
#include "kosmos/push.h"
#include "kosmos/queue.h"
#include "kosmos/sync.h"
#include "kosmos/trace.h"
#include "kosmos/types.h"
#include "tp/heap_use.cuh"
#include "tp/rs_layout.h"
#include "tp/rs_sched.h"

namespace kosmos {

// One staged fp32 partial tile: kBM x tile_n (the builders' tile width), row-major.
// Rows and columns past the problem are never written (the engines skip them)
// nor read back.
KOSMOS_HD inline size_t rs_tile_elems(int tile_n) { return (size_t)kTileRows * tile_n; }

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

// Tr: the transport, rs_cta's. Shared: the CTA's shared state, with at least
// `int bcast` (claims), `static const char* kernel()` (the kernel's name in
// timeout reports) and, for the portable builders, `portable::EngineSmem tile`.
template <typename T, class Tr, class Shared>
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
  KOSMOS_DEVICE WaitSite site(const char* flag, int i) const {
    return {Shared::kernel(), p.rank, (int)blockIdx.x, flag, i};
  }
  KOSMOS_DEVICE int bcast(int v) { return cta_bcast(&sm.bcast, v); }
  KOSMOS_DEVICE int claim_reduce() {
    return bcast(threadIdx.x == 0 ? (int)WorkQueue{&ctrl->reduce_next, 0}.claim() : 0);
  }
  // HeapUse answers for every peer (and for a previous launch of another op) at once.
  KOSMOS_DEVICE void guard_data() { heap_use_guard(data_free, p.heap[p.rank], p.timeout_ns, site("done(last use)", 0)); }
  // Until this rank's builders have claimed GEMM tile j (no acquire: the
  // claim's tiles are waited for by their bands' flags).
  KOSMOS_DEVICE void wait_build_claimed(int j) {
    if (threadIdx.x == 0) {
      const TraceSpan wait;
      const uint64_t start = now_ns();
      while (!WorkQueue{&ctrl->build_next, 0}.claimed((uint32_t)j)) {
        if (now_ns() - start > p.timeout_ns)
          timeout_trap(site("build_next(claims)", j), (uint64_t)j + 1, ld_relaxed_u32(&ctrl->build_next),
                       p.timeout_ns);
      }
      wait.close(p.trace, blockIdx.x, kTraceWait, j);
    }
    __syncthreads();
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
      const RsStaged h = rs_staged<Tr>(src, p.rank);
      wait_ge<Scope::kSys>(&ctrl_of(h.home)->pub[rs_flag_index(b, h.pos)], epoch, p.timeout_ns,
                           site("pub", src * kRsMaxBands + b));
      wait.close(p.trace, blockIdx.x, kTraceWait, b);
    }
    __syncthreads();
  }
  // Push: our staging may take the peers' partials of this epoch once its last
  // readers are done.
  KOSMOS_DEVICE void announce_ready() {
    guard_data();
    Tr::announce_ready(p.heap, p.ctrl_off + offsetof(RsCtrl, ready), epoch, p.tp, p.rank);
  }
  KOSMOS_DEVICE void reduce(const RsSlice& sl);
  KOSMOS_DEVICE void finish(int grid);
};

// Sums the slice's tiles over ranks 0..tp-1 in that order (rs_reduce_fixed),
// threads splitting the elements; L2-only loads, since peers and other CTAs
// wrote the staging during this launch. Rounded once into Y.
template <typename T, class Tr, class Shared>
KOSMOS_DEVICE void RsDeviceOps<T, Tr, Shared>::reduce(const RsSlice& sl) {
  const TraceSpan span;
  const RsShape& s = p.shape;
  for (int k = sl.k0; k < sl.k0 + sl.n; ++k) {
    const int slot = rs_stage_slot(s, sl.band, p.rank, k);
    const int bn = p.tile_n;
    const int row0 = (sl.band * s.R + k / s.NT) * kTileRows, col0 = (k % s.NT) * bn;
    const int rows = min(kTileRows, p.rows - row0), cols = min(bn, p.N - col0);
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
template <typename T, class Tr, class Shared>
KOSMOS_DEVICE void RsDeviceOps<T, Tr, Shared>::finish(int grid) {
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

// GEMM tile claims in rs_build_item order, for the engine's one claiming thread
// (portable: thread 0; Hopper: the claimer thread); within a band column by
// column (rs_band_tile_colmajor), which matters once bands are several rows
// tall (RsConfig.band_rows, csrc/tn_rs_cuda.cu rs_shape). Engine tile row m is
// chunk c's tile row tr at m = c * T + tr. Tr: the transport, rs_cta's.
template <class Tr>
struct RsSched {
  RsCtrl* ctrl;
  RsShape s;
  uint64_t epoch;
  KOSMOS_DEVICE bool next(gemm::TileCoord& t) {
    const int j = (int)WorkQueue{&ctrl->build_next, 0}.claim();
    if (j >= rs_n_build(s)) return false;
    const RsTile rt = rs_build_item<Tr>(s, j);
    // Claimed, not yet built: peers' reducers may now wait on this step's bands.
    if (!Tr::kFold && j + 1 == rs_step_end(s, rt.band))
      store_release<Scope::kSys>(&ctrl->step_claimed[rt.band], epoch);
    const RsBandTile bt = rs_band_tile_colmajor(s, rt.band, rt.k);
    t = gemm::TileCoord{rt.chunk * s.T + rt.band * s.R + bt.row, bt.col};
    return true;
  }
};

}  // namespace kosmos
