// AG+GEMM's device operations, shared by its portable builders (tp/ag_gemm.cuh),
// its Hopper builders (tp/ag_gemm_sm90.cuh) and bulk AG || NN (tp/bulk_ag*.cuh):
// the launch parameters, the movers (publish, pull, push: AgDeviceOps), the
// epoch's finish, and the build queue's claims for a tile engine (AgSched).
// The CTA life they serve is tp/ag_sched.h ag_cta, over the same transport Tr.
#pragma once
#include <cstddef>
#include <cstdint>

#include "gemm/tile_problem.h"
#include "kosmos/cta.h"
#include "kosmos/platform.h"
#include "kosmos/push.h"
#include "kosmos/queue.h"
#include "kosmos/sync.h"
#include "kosmos/trace.h"
#include "kosmos/transport.h"
#include "tp/ag_layout.h"
#include "tp/ag_sched.h"
#include "tp/heap_use.cuh"

namespace kosmos {

template <typename T>
struct AgParams {
  const T* x;  // [batch * m_local, K] local shard
  const T* w;  // [K, N] (ag_tn), [N, K] (ag_nn: dX = dY @ w.T)
  T* y;        // [batch, tp * m_local, N]
  // [batch, tp * m_local, K]: every shard's rows as all_gather_rows(x) lays
  // them out, written by the movers (AgOp::kNn's gathered dY, kBulk's X).
  T* g_out;
  // Pulled rows land in g_out only, where the builders read them (the Hopper
  // ag_nn, when every shard's tile rows are whole tile rows of g_out: m_local %
  // kBM == 0); otherwise in this rank's gather slot too.
  bool pull_to_out_only;
  // ag_nn, bulk_ag_nn: the peers pull our rows from x itself, not from a copy
  // in our gather slot (AgCtrl::src_ptr). The launcher sets it only where
  // every rank of the group is in this process and x is memory a peer may
  // read (a cuMemAlloc allocation, mapped to the peers by peer access).
  bool direct;
  char* heap[kMaxRanks];  // every rank's heap base, mapped here
  int rank, tp, m_local, rows;  // rows = batch * m_local (flattened local rows)
  int K, N;
  AgShape shape;
  int movers;
  int switching;  // 0: movers stop when their queue is empty (fixed split; movers <= grid - 1)
  size_t ctrl_off;    // this group's control block: ag_ctrl_offset(slot), same on every rank
  size_t slot_bytes;  // bytes per rank slot in the gather region
  uint64_t timeout_ns;
  TraceBuf trace;     // role timeline (KOSMOS_TRACE builds; records == nullptr: off)
};

// Which op the movers and builders serve. kTn: ag_tn, Y = AG(x) @ w. kNn:
// ag_nn, dX = AG(dY) @ w.T (w [N, K]), the gathered rows also land in g_out.
// kBulk: bulk_ag_nn's gather, whose rows land in g_out only (its builders read
// none of them, tp/bulk_ag.cuh). Compile-time, so ag_tn's kernels compile none
// of the gathered output's code.
enum class AgOp { kTn, kNn, kBulk };

// The movers' device operations. Shared: the CTA's shared state, with at least
// `int bcast` (claims). Tr: the transport (kosmos/pull.h, kosmos/push.h), as
// ag_cta's; a pull kernel compiles no push code, which keeps its registers.
template <typename T, class Shared, class Tr, AgOp kOp = AgOp::kTn>
struct AgDeviceOps {
  const AgParams<T>& p;
  Shared& sm;
  AgCtrl* ctrl;
  uint64_t epoch;
  bool peers_done;  // this CTA has seen the data region's last readers finish

  KOSMOS_DEVICE AgCtrl* ctrl_of(int r) const { return reinterpret_cast<AgCtrl*>(p.heap[r] + p.ctrl_off); }
  KOSMOS_DEVICE char* slot(int r, int src) const { return p.heap[r] + kHeapDataOffset + (size_t)src * p.slot_bytes; }
  KOSMOS_DEVICE WaitSite site(const char* flag, int i) const { return {"ag_tn", p.rank, (int)blockIdx.x, flag, i}; }

  KOSMOS_DEVICE int bcast(int v) { return cta_bcast(&sm.bcast, v); }
  KOSMOS_DEVICE int claim_move() { return bcast(threadIdx.x == 0 ? (int)WorkQueue{&ctrl->move_next, 0}.claim() : 0); }
  KOSMOS_DEVICE void guard_data();
  KOSMOS_DEVICE void announce_ready();
  KOSMOS_DEVICE void announce_source();
  KOSMOS_DEVICE const char* await_source(const AgMove& m, int i);
  KOSMOS_DEVICE void land(char* slot_dst, const char* from, int src, int t);
  KOSMOS_DEVICE void move(const AgMove& m, int i);
  KOSMOS_DEVICE void push(const AgMove& m, int i, size_t off, size_t bytes);
  KOSMOS_DEVICE void finish(int grid);
};

// 16-byte loads each mover thread keeps in flight. Pull is latency-bound per
// CTA: on 2xH200 (benchmarks/RESULTS.md, transport, 2026-11-30) 4 CTAs pulled
// 101 GB/s with 4 in flight and 165 GB/s with 8 (push, whose stores do not wait,
// 180 / 182), so 8 lets a smaller crew fill the link and leaves more CTAs to build.
constexpr int kMoveInFlight = 8;

// Bytes of tile row t of a shard: rows [t*BM, min((t+1)*BM, rows)).
template <typename T>
KOSMOS_DEVICE void row_range(const AgParams<T>& p, int t, size_t* off, size_t* bytes) {
  const size_t r0 = (size_t)t * kTileRows;
  size_t r1 = r0 + kTileRows;
  if (r1 > (size_t)p.rows) r1 = p.rows;
  *off = r0 * p.K * sizeof(T);
  *bytes = (r1 - r0) * p.K * sizeof(T);
}

// The data region is overwritten (by a publish or a pull, or by the peers'
// pushes after announce_ready) only after the last writer's readers are done
// (tp/heap_use.cuh).
template <typename T, class Shared, class Tr, AgOp kOp>
KOSMOS_DEVICE void AgDeviceOps<T, Shared, Tr, kOp>::guard_data() {
  heap_use_guard(peers_done, p.heap[p.rank], p.timeout_ns, site("done(last use)", 0));
}

// Push: our gather region may take the peers' pushes of this epoch once its
// last readers are done (guard_data).
template <typename T, class Shared, class Tr, AgOp kOp>
KOSMOS_DEVICE void AgDeviceOps<T, Shared, Tr, kOp>::announce_ready() {
  guard_data();
  Tr::announce_ready(p.heap, p.ctrl_off + offsetof(AgCtrl, ready), epoch, p.tp, p.rank);
}

// x's tile row m.t straight into peer m.dst's slot for this rank, once the peer
// announced its region free; then the peer's arrived flag. The barrier orders
// every thread's remote stores before thread 0's system-scope release, which the
// peer's builders acquire at system scope (and fence to the async proxy before
// TMA reads the rows).
template <typename T, class Shared, class Tr, AgOp kOp>
KOSMOS_DEVICE void AgDeviceOps<T, Shared, Tr, kOp>::push(const AgMove& m, int i, size_t off, size_t bytes) {
  Tr::wait_ready(ctrl->ready, m.dst, epoch, p.timeout_ns, "ag_tn", p.rank, p.trace, i);
  const TraceSpan span;
  cta_copy16<kMoveInFlight>(slot(m.dst, p.rank) + off, reinterpret_cast<const char*>(p.x) + off, bytes);
  __syncthreads();
  if (threadIdx.x == 0) {
    store_release<Scope::kSys>(&ctrl_of(m.dst)->arrived[p.rank * kMaxTileRows + m.t], epoch);
    span.close(p.trace, blockIdx.x, kTraceMove, i);
  }
}

// Tile row t of shard src, read at `from` (that shard's row 0), into this rank's
// slot `slot_dst` (kBulk's pulls: nullptr, none) and, for kNn and kBulk, into
// g_out: one contiguous run per batch the tile row spans, each vector read once
// and stored to both.
template <typename T, class Shared, class Tr, AgOp kOp>
KOSMOS_DEVICE void AgDeviceOps<T, Shared, Tr, kOp>::land(char* slot_dst, const char* from, int src, int t) {
  size_t off, bytes;
  row_range(p, t, &off, &bytes);
  if constexpr (kOp == AgOp::kTn) return cta_copy16<kMoveInFlight>(slot_dst + off, from + off, bytes);
  const size_t rb = (size_t)p.K * sizeof(T);
  const int r1 = min((t + 1) * kTileRows, p.rows);
  for (int g = t * kTileRows; g < r1;) {
    const int b = g / p.m_local, e = min(r1, (b + 1) * p.m_local);
    char* out = reinterpret_cast<char*>(p.g_out) + ag_gathered_row(src, g, p.tp, p.m_local) * rb;
    cta_copy16_to<kMoveInFlight, true>(out, slot_dst ? slot_dst + g * rb : nullptr, from + g * rb, (e - g) * rb);
    g = e;
  }
}

// Pull, ag_nn and bulk_ag_nn (a no-op for ag_tn, whose peers always read our
// slot): CTA 0's thread 0, first thing in the launch, tells the peers where our
// shard is this epoch: x itself where p.direct, else 0 (our slot, tile row by
// tile row as published); tp/heap_use.cuh announce_source_at.
template <typename T, class Shared, class Tr, AgOp kOp>
KOSMOS_DEVICE void AgDeviceOps<T, Shared, Tr, kOp>::announce_source() {
  if constexpr (kOp != AgOp::kTn) {
    if (threadIdx.x != 0) return;
    announce_source_at(&ctrl->src_ptr, &ctrl->src_epoch, ctrl->done, p.direct ? reinterpret_cast<uint64_t>(p.x) : 0,
                       epoch, p.tp, p.rank, p.timeout_ns, site("done(source)", 0));
  }
}

// A pull of (m.src, m.t): where that shard's rows are, once they may be read
// (every thread; thread 0 waits, the barrier orders the others' loads behind its
// acquires). ag_tn: the source's slot once it published the row. ag_nn,
// bulk_ag_nn: the source's announced x (valid for the whole epoch: the source
// keeps its launch alive until we are done, finish), or its slot once published.
template <typename T, class Shared, class Tr, AgOp kOp>
KOSMOS_DEVICE const char* AgDeviceOps<T, Shared, Tr, kOp>::await_source(const AgMove& m, int i) {
  const AgCtrl* src = ctrl_of(m.src);
  const TraceSpan wait;
  if (threadIdx.x == 0) {
    uint64_t at = 0;
    if constexpr (kOp != AgOp::kTn) {
      wait_ge<Scope::kSys>(&src->src_epoch, epoch, p.timeout_ns, site("peer_source", m.src));
      at = *reinterpret_cast<const volatile uint64_t*>(&src->src_ptr);
    }
    if (at == 0)
      wait_ge<Scope::kSys>(&src->pub[m.t], epoch, p.timeout_ns, site("peer_pub", m.src * kMaxTileRows + m.t));
    wait.close(p.trace, blockIdx.x, kTraceWait, i);
  }
  __syncthreads();
  if constexpr (kOp != AgOp::kTn) {
    const uint64_t at = *reinterpret_cast<const volatile uint64_t*>(&src->src_ptr);
    if (at != 0) return reinterpret_cast<const char*>(at);
  }
  return slot(m.src, m.src);
}

template <typename T, class Shared, class Tr, AgOp kOp>
KOSMOS_DEVICE void AgDeviceOps<T, Shared, Tr, kOp>::move(const AgMove& m, int i) {
  size_t off, bytes;
  row_range(p, m.t, &off, &bytes);
  guard_data();
  // Every push-queue item is a push (ag_move_item); without this test ptxas
  // allocates the Hopper push kernel 4 more bytes of spills.
  if constexpr (Tr::kPush)
    if (!m.publish && m.dst != p.rank) return push(m, i, off, bytes);
  if (m.publish) {
    const TraceSpan span;
    // Direct: the peers read x itself; only the gathered output wants our rows.
    bool to_slot = true;
    if constexpr (kOp != AgOp::kTn) to_slot = !p.direct;
    land(to_slot ? slot(p.rank, p.rank) : nullptr, reinterpret_cast<const char*>(p.x), p.rank, m.t);
    __syncthreads();  // all writes of the row before the release below
    if (threadIdx.x == 0 && to_slot) store_release<Scope::kSys>(&ctrl->pub[m.t], epoch);  // peers read it
    if (threadIdx.x == 0) span.close(p.trace, blockIdx.x, kTraceMove, i);
    return;
  }
  const char* from = await_source(m, i);
  const TraceSpan pull;
  land(kOp == AgOp::kBulk || p.pull_to_out_only ? nullptr : slot(p.rank, m.src), from, m.src, m.t);
  __syncthreads();
  if (threadIdx.x == 0) store_release<Scope::kGpu>(&ctrl->arrived[m.src * kMaxTileRows + m.t], epoch);
  if (threadIdx.x == 0) pull.close(p.trace, blockIdx.x, kTraceMove, i);
}

// The last CTA to finish tells every peer we are done reading its slot for this
// epoch, resets the queues and advances the epoch: no host work between launches.
template <typename T, class Shared, class Tr, AgOp kOp>
KOSMOS_DEVICE void AgDeviceOps<T, Shared, Tr, kOp>::finish(int grid) {
  if (!last_cta_done(&ctrl->finished, grid)) return;
  release_peers(p.heap, p.ctrl_off + offsetof(AgCtrl, done), epoch, p.tp, p.rank);
  // Direct: the peers read x itself, which XLA may reuse once this launch ends,
  // so it ends only after every peer's last CTA (past its last pull) released
  // done[] to us. Each released ours first, and a peer's CTAs wait on nothing
  // we do after our CTAs are done, so the wait ends.
  if constexpr (kOp != AgOp::kTn)
    if (p.direct) wait_peers_done(ctrl->done, epoch, p.tp, p.rank, p.timeout_ns, site("done(x read)", 0));
  ctrl->move_next = 0;
  ctrl->build_next = 0;
  ctrl->finished = 0;
  store_release<Scope::kGpu>(&ctrl->epoch, epoch);
}

// The build queue's claims in ag_build_item order, for the engine's one
// claiming thread (portable: thread 0; Hopper: the claimer thread). Engine
// tile row m is shard src's tile row t at m = src * T + t.
struct AgSched {
  AgCtrl* ctrl;
  AgShape s;
  KOSMOS_DEVICE bool next(gemm::TileCoord& t) {
    const int j = (int)WorkQueue{&ctrl->build_next, 0}.claim();
    if (j >= ag_n_build(s)) return false;
    const AgBuild b = ag_build_item(s, j);
    t = gemm::TileCoord{b.src * s.T + b.t, b.tn};
    return true;
  }
};

// Both engines' row_ptr hook (gemm/tile_hooks.h) over AG's tile rows: engine
// row r of tile t (shard src = t.m / T, flattened local row lr) goes to row
// (lr / m_local) * (tp * m_local) + src * m_local + lr % m_local of the
// gathered [batch, tp * m_local, N] output h.y; rows past the shard's end to
// nowhere (nullptr).
template <class OutT, class Hooks>
KOSMOS_DEVICE OutT* ag_row_ptr(const Hooks& h, gemm::TileCoord t, int r) {
  const int src = t.m / h.T;
  const int lr = r - src * h.T * kTileRows;
  if (lr >= h.rows) return nullptr;
  return reinterpret_cast<OutT*>(h.y) + ag_gathered_row(src, lr, h.tp, h.m_local) * h.N;
}

}  // namespace kosmos
