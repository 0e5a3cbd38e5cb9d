// Fused bulk reduce-scatter || NT GEMM (paper §3.2, Figure 5: the column-parallel
// weight gradient). Two independent results in one persistent launch:
//   dx = reduce_scatter_rows(dx_partial)  [rows, k], summed in fp32 in rank order
//        and rounded once (bitwise reproducible)
//   dw = x_gathered^T @ dy                [k, n], summed over every row (NT)
// The schedule (queues, roles, deadlock freedom) is tp/bulk_rs_sched.h, shared
// with the CPU emulation; this file supplies its device operations and the
// portable kernel (the Hopper one: tp/bulk_rs_sm90.cuh).
//
// Transport: push (kosmos/push.h), as GEMM+RS's push. A mover copies band b
// of chunk c of our dx_partial into rank c's staging slot for us
// (bulk_stage_pos) and releases c's pub[b][rank] at system scope; c's reducers
// sum their own chunk band by band, reading their own term straight from
// dx_partial and the peers' from local staging once they have acquired those
// flags. A peer's staging takes pushes of an epoch only after the peer
// announced it (ready[], once its data region's last readers are done:
// tp/heap_use.cuh).
//
// Control block: GEMM+RS's (RsCtrl, rs_ctrl_offset(slot)); the push queue is its
// move_next. Sharing it with tn_rs is safe: the ops of a group run in the same
// order on every rank, so launch number e of the block is the same op, in epoch
// e, everywhere; every flag (ready, pub, done, step_claimed) holds the epoch of
// its last release and every wait asks for >= this launch's epoch, which only
// this launch's releases (on whichever rank) can satisfy; a peer one launch
// ahead writes nothing of ours before we announce (ready[]) or finish (done[]).
// The counters (queues, finished, band_count) are local and left zero by the
// last CTA of each op.
//
// Direct sources: where every rank of the group is in this process and
// dx_partial is cuMemAlloc memory (BulkRsShape::direct, the launcher's
// peers_read_directly), a rank pushes nothing: it announces dx_partial's
// address (RsCtrl::src_ptr) and the peers' reducers read their chunk's terms
// straight from it; its launch ends only once every peer is done reading it.
#pragma once
#include <cstddef>
#include <cstdint>

#include "gemm/portable/tile_engine.cuh"
#include "kosmos/cta.h"
#include "kosmos/platform.h"
#include "kosmos/push.h"
#include "kosmos/queue.h"
#include "kosmos/sync.h"
#include "kosmos/trace.h"
#include "kosmos/transport.h"
#include "kosmos/types.h"
#include "tp/bulk_rs_sched.h"
#include "tp/heap_use.cuh"
#include "tp/queue_sched.h"
#include "tp/rs_layout.h"
#include "tp/rs_sum.cuh"

namespace kosmos {

// Staging bytes per writer at a chunk's owner: one chunk of partials, in
// 256-byte aligned slots (tp - 1 of them, none for the owner's own partial).
KOSMOS_HD inline size_t bulk_slot_bytes(size_t rows, size_t cols, size_t elem) {
  return (rows * cols * elem + 255) / 256 * 256;
}

template <typename T>
struct BulkRsParams {
  const T* dxp;  // [tp * rows, k] our dX partials, rank-major: chunk c = rows [c * rows, (c + 1) * rows)
  T* dx;         // [rows, k]: our chunk of the sum over ranks
  const T* xg;   // [M, k], M = tp * rows: x gathered, batch and sequence flattened as in dy
  const T* dy;   // [M, n]
  T* dw;         // [k, n] = xg^T @ dy (engine NT: M_e = k, N_e = n, K_e = M)
  char* heap[kMaxRanks];  // every rank's heap base, mapped here
  int rank, tp, M, k, n;
  BulkRsShape shape;  // rows per chunk, cols = k, bands, slices; GEMM tiles in the builders' engine's units
  int movers;
  int switching;      // 0: a fixed split (tp/bulk_rs_sched.h; 1 <= movers <= grid - 1)
  size_t ctrl_off;    // rs_ctrl_offset(slot), the same on every rank
  size_t slot_bytes;  // bulk_slot_bytes(rows, k, sizeof(T))
  uint64_t timeout_ns;
  TraceBuf trace;     // role timeline (KOSMOS_TRACE builds; records == nullptr: off)
};

// 16-byte loads in flight per mover thread (as AG's movers: 8 fill a link with
// fewer CTAs than 4, benchmarks/RESULTS.md transport).
constexpr int kBulkPushInFlight = 8;

// GEMM claims in bulk_gemm_tile order from the RS control block's build queue;
// tiles wait for nothing.
using BulkRsGemmSched = QueueSched<RsCtrl, BulkRsGemmOrder>;

// Shared: the CTA's shared state, with at least `int bcast` (claims) and
// `static const char* kernel()`, the kernel's name in timeout reports.
// kSumGroups: 16-byte loads per reducer thread and term in flight (rs_sum_span).
template <typename T, class Shared, int kSumGroups = 8>
struct BulkRsDeviceOps {
  const BulkRsParams<T>& p;
  Shared& sm;
  RsCtrl* ctrl;
  uint64_t epoch;

  KOSMOS_DEVICE RsCtrl* ctrl_of(int r) const { return reinterpret_cast<RsCtrl*>(p.heap[r] + p.ctrl_off); }
  // Writer w's partials of home h's chunk, in h's staging: [rows, k].
  KOSMOS_DEVICE T* staging(int h, int w) const {
    return reinterpret_cast<T*>(p.heap[h] + kHeapDataOffset + (size_t)bulk_stage_pos(w, h) * p.slot_bytes);
  }
  KOSMOS_DEVICE WaitSite site(const char* flag, int i) const {
    return {Shared::kernel(), p.rank, (int)blockIdx.x, flag, i};
  }
  KOSMOS_DEVICE int claim(uint32_t* next) { return cta_bcast(&sm.bcast, threadIdx.x == 0 ? (int)claim_u32(next) : 0); }
  KOSMOS_DEVICE int claim_push() { return claim(&ctrl->move_next); }
  KOSMOS_DEVICE int claim_reduce() { return claim(&ctrl->reduce_next); }
  KOSMOS_DEVICE void announce_ready();
  KOSMOS_DEVICE void push(const BulkPush& m, int i);
  KOSMOS_DEVICE void reduce(const BulkSlice& sl);
  KOSMOS_DEVICE void finish(int grid);
};

// Our staging may take the peers' pushes of this epoch once its last readers,
// of whichever op wrote it last, are done. Once per CTA (bulk_rs_cta), so the
// guard is too. The CTA also says where the peers read our partials this
// epoch: dx_partial itself where direct, else 0 (our pushes); every CTA writes
// the same, and only once every peer has ended this op's previous epoch
// (done[r] >= epoch - 1, released by each peer's last CTA after its last read),
// so no peer still reads the previous epoch's address.
template <typename T, class Shared, int kSumGroups>
KOSMOS_DEVICE void BulkRsDeviceOps<T, Shared, kSumGroups>::announce_ready() {
  bool seen = false;
  heap_use_guard(seen, p.heap[p.rank], p.timeout_ns, site("done(last use)", 0));
  if (threadIdx.x == 0)
    announce_source_at(&ctrl->src_ptr, &ctrl->src_epoch, ctrl->done,
                       p.shape.direct ? reinterpret_cast<uint64_t>(p.dxp) : 0, epoch, p.tp, p.rank, p.timeout_ns,
                       site("done(source)", 0));
  Push::announce_ready(p.heap, p.ctrl_off + offsetof(RsCtrl, ready), epoch, p.tp, p.rank);
}

// n elements from src to dst, CTA-wide: 16-byte vectors where both ends are
// aligned (every band is, unless rows * k * sizeof(T) is not a multiple of 16
// and the chunk starts misaligned), element by element otherwise. Whole groups
// of kBulkPushInFlight loads per thread, then single vectors: cta_copy16's
// predicated groups put the loads in local memory in the Hopper kernel, with
// its two push sites, before and after the engine (ptxas: 244 bytes of spill
// stores with cta_copy16<8>, none with this).
template <typename T>
KOSMOS_DEVICE void bulk_copy(T* dst, const T* src, size_t n) {
  size_t done = 0;
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % kVecBytes == 0) {
    auto* d = reinterpret_cast<Vec16*>(dst);
    auto* s = reinterpret_cast<const Vec16*>(src);
    const size_t nvec = n * sizeof(T) / kVecBytes, bd = blockDim.x;
    size_t i = threadIdx.x;
    for (; i + (kBulkPushInFlight - 1) * bd < nvec; i += kBulkPushInFlight * bd) {
      Vec16 v[kBulkPushInFlight];
#pragma unroll
      for (int u = 0; u < kBulkPushInFlight; ++u) v[u] = load_cg(s + i + u * bd);
#pragma unroll
      for (int u = 0; u < kBulkPushInFlight; ++u) d[i + u * bd] = v[u];
    }
    for (; i < nvec; i += bd) d[i] = load_cg(s + i);
    done = nvec * kVecBytes / sizeof(T);
  }
  for (size_t i = done + threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// Band m.band of chunk m.dst of our partials, straight into m.dst's staging
// once it announced it free; then its pub flag. The barrier orders every
// thread's remote stores before thread 0's system-scope release, which the
// owner's reducers acquire at system scope.
template <typename T, class Shared, int kSumGroups>
KOSMOS_DEVICE void BulkRsDeviceOps<T, Shared, kSumGroups>::push(const BulkPush& m, int i) {
  Push::wait_ready(ctrl->ready, m.dst, epoch, p.timeout_ns, Shared::kernel(), p.rank, p.trace, i);
  const TraceSpan span;
  const BulkRsShape& s = p.shape;
  const size_t off = (size_t)bulk_band_row0(s, m.band) * s.cols;
  bulk_copy(staging(m.dst, p.rank) + off, p.dxp + (size_t)m.dst * s.rows * s.cols + off,
            (size_t)bulk_band_len(s, m.band) * s.cols);
  __syncthreads();
  if (threadIdx.x == 0) {
    store_release<Scope::kSys>(&ctrl_of(m.dst)->pub[rs_flag_index(m.band, p.rank)], epoch);
    span.close(p.trace, blockIdx.x, kTraceMove, i);
  }
}

// Slice sl of our chunk: thread 0 acquires every peer's announcement and, for
// a peer that pushes, its push of the band (the barrier orders every thread's
// loads after those acquires); then the fixed-order sum, our own term read from
// dx_partial, a direct peer's from its dx_partial (sm.src), the others' from
// staging, rounded once into dx.
template <typename T, class Shared, int kSumGroups>
KOSMOS_DEVICE void BulkRsDeviceOps<T, Shared, kSumGroups>::reduce(const BulkSlice& sl) {
  const BulkRsShape& s = p.shape;
  if (threadIdx.x == 0) {
    const TraceSpan wait;
    for (int src = 0; src < p.tp; ++src) {
      if (src == p.rank) continue;
      const RsCtrl* c = ctrl_of(src);
      wait_ge<Scope::kSys>(&c->src_epoch, epoch, p.timeout_ns, site("peer_source", src));
      const uint64_t at = *reinterpret_cast<const volatile uint64_t*>(&c->src_ptr);
      sm.src[src] = at;
      if (at == 0)
        wait_ge<Scope::kSys>(&ctrl->pub[rs_flag_index(sl.band, src)], epoch, p.timeout_ns,
                             site("pub", src * kRsMaxBands + sl.band));
    }
    wait.close(p.trace, blockIdx.x, kTraceWait, sl.band);
  }
  __syncthreads();
  const TraceSpan span;
  const size_t off = (size_t)bulk_band_row0(s, sl.band) * s.cols + sl.e0;
  const size_t chunk = (size_t)p.rank * s.rows * s.cols + off;  // our chunk in every rank's dx_partial
  const T* own = p.dxp + chunk;
  const T* peers = reinterpret_cast<const T*>(p.heap[p.rank] + kHeapDataOffset) + off;
  const size_t slot = p.slot_bytes / sizeof(T);
  const int rank = p.rank;
  const uint64_t* src = sm.src;
  auto term = [=](int r) {
    return r == rank ? own : src[r] ? reinterpret_cast<const T*>(src[r]) + chunk
                                    : peers + (size_t)bulk_stage_pos(r, rank) * slot;
  };
  rs_sum_span<T, kSumGroups>(p.tp, term, p.dx + off, (size_t)(sl.e1 - sl.e0));
  if (threadIdx.x == 0) span.close(p.trace, blockIdx.x, kTraceReduce, sl.band);
}

// The last CTA to finish tells every peer we are done with its data region for
// this epoch (release_peers: done[rank] there, and HeapUse here), resets the
// local queues and advances the epoch: no host work between launches.
template <typename T, class Shared, int kSumGroups>
KOSMOS_DEVICE void BulkRsDeviceOps<T, Shared, kSumGroups>::finish(int grid) {
  if (!last_cta_done(&ctrl->finished, grid)) return;
  release_peers(p.heap, p.ctrl_off + offsetof(RsCtrl, done), epoch, p.tp, p.rank);
  // Direct: the peers read dx_partial itself, which XLA may reuse once this
  // launch ends, so it ends only after every peer's last CTA released done[].
  if (p.shape.direct) wait_peers_done(ctrl->done, epoch, p.tp, p.rank, p.timeout_ns, site("done(partials read)", 0));
  ctrl->move_next = 0;
  ctrl->build_next = 0;
  ctrl->reduce_next = 0;
  ctrl->finished = 0;
  store_release<Scope::kGpu>(&ctrl->epoch, epoch);
}

// The portable builders: dw's 128x128 tiles on the SIMT engine (f32, f16, bf16).
template <typename T>
using BulkRsEngine = portable::TileEngine<gemm::Layout::NT, T, T>;

template <typename T>
struct BulkRsShared {
  typename BulkRsEngine<T>::Smem tile;
  uint64_t src[kMaxRanks];  // a reduce's peers' dx_partial addresses (0: staged), thread 0's
  int bcast;
  static KOSMOS_DEVICE const char* kernel() { return "bulk_rs_nt"; }
};

template <typename T>
struct BulkRsOps : BulkRsDeviceOps<T, BulkRsShared<T>> {
  KOSMOS_DEVICE void build_all() {
    const TraceSpan span;
    const BulkRsParams<T>& a = this->p;
    BulkRsGemmSched sched{this->ctrl, a.shape};
    gemm::NoHooks hooks;
    BulkRsEngine<T>::run(gemm::Problem{a.xg, a.dy, a.dw, a.k, a.n, a.M}, this->sm.tile, sched, hooks);
    if (threadIdx.x == 0) span.close(a.trace, blockIdx.x, kTraceBuild);
  }
};

// Dynamic shared memory is only padding: it makes two CTAs never fit on one SM.
template <typename T>
__global__ void __launch_bounds__(BulkRsEngine<T>::kThreads, 1) bulk_rs_nt_kernel(const BulkRsParams<T> p) {
  __shared__ BulkRsShared<T> sm;
  RsCtrl* ctrl = reinterpret_cast<RsCtrl*>(p.heap[p.rank] + p.ctrl_off);
  const uint64_t epoch = launch_epoch(&ctrl->epoch);
  BulkRsOps<T> ops{{p, sm, ctrl, epoch}};
  bulk_rs_cta(ops, p.shape, (int)blockIdx.x, (int)gridDim.x, p.movers, p.switching != 0);
}

}  // namespace kosmos
