// The AG+GEMM schedule (paper §3.2.1), plain host/device code: the GPU kernels
// (both engines' builders, and bulk AG || NN's) and the CPU emulation
// (tests/host/ag_sched_emu.cc) run this same function over different `Ops`.
//
// Move queue (per rank), pull transport: T "publish" items (copy local tile row
// t into this rank's slot of its gather buffer, then release pub[t] for the
// peers), then T*(tp-1) "pull" items, tile-row-major and source-minor so every
// link is busy. Publish items precede all pulls, so once a pull is claimed
// anywhere every publish of that rank was claimed earlier by a running CTA: a
// pull only ever waits on claimed work, on every rank. ag_nn and bulk_ag_nn
// may pull straight from the source's x instead (AgParams::direct): CTA 0
// announces first thing where the peers read its rows (announce_source), its
// publishes then write only the gathered output, and its launch ends only once
// every peer is done with its x (finish).
// Push transport (Tr = Push; only the Hopper kernels compile it): per local tile row t, one
// push per peer (destination-minor), T*(tp-1) items, and no publish: the own
// shard's builders read x itself (tp/ag_gemm_sm90.cuh). A push copies x's row t
// straight into the peer's slot for this rank and releases the peer's arrived
// flag: one NVLink copy per row and no wait on a peer's publish. It waits only
// on the peer's ready[] (its gather region is free this epoch), which the
// peer's movers announce first thing (ag_cta).
// Build queue: every tile of the local shard first (its rows come straight from
// x), then peer tiles tile-row-major and source-minor (the pull order; under
// push the order in which each peer's rows leave it).
// The transport Tr (kosmos/pull.h Pull, kosmos/push.h Push) is a template
// parameter of the move queue and of ag_cta: a kernel compiles one queue.
#pragma once

#include <cstddef>

#include "gemm/tile_order.h"
#include "kosmos/platform.h"
#include "kosmos/roles.h"

namespace kosmos {

struct AgShape {
  int tp, rank;
  int T;      // tile rows per shard
  int NT;     // tile columns of the output
  int group;  // build order: bands of `group` tile rows walked column by column; <= 1: row-major
};

struct AgMove {
  bool publish;
  int src;  // rank whose shard this tile row belongs to
  int t;    // tile row within that shard
  int dst;  // rank whose gather slot for src it lands in (a push: the peer)
};

struct AgBuild {
  int src, t, tn;  // shard src's tile row t, tile column tn
};

// Row of the gathered [batch, tp * m_local, width] output (all_gather_rows over
// a leading batch dim: batch-major, then rank) that flattened local row lr of
// shard src goes to.
KOSMOS_HD inline size_t ag_gathered_row(int src, int lr, int tp, int m_local) {
  const int b = lr / m_local;
  return ((size_t)b * tp + src) * m_local + (lr - b * m_local);
}

// With no peers there is nothing to publish or pull; push publishes nothing.
template <class Tr>
KOSMOS_HD inline int ag_n_move(const AgShape& s) {
  return s.tp > 1 ? s.T * (Tr::kPush ? s.tp - 1 : s.tp) : 0;
}
KOSMOS_HD inline int ag_n_build(const AgShape& s) { return s.T * s.NT * s.tp; }

// Peer tile row q of the build order (and pull q): tile-row-major, source-minor.
KOSMOS_HD inline AgMove ag_peer_row(const AgShape& s, int q) {
  const int peers = s.tp - 1;
  return {false, (s.rank + 1 + q % peers) % s.tp, q / peers, s.rank};
}

template <class Tr>
KOSMOS_HD inline AgMove ag_move_item(const AgShape& s, int i) {
  if constexpr (Tr::kPush) {
    const int t = i / (s.tp - 1), k = 1 + i % (s.tp - 1);
    return {false, s.rank, t, (s.rank + k) % s.tp};
  }
  if (i < s.T) return {true, s.rank, i, s.rank};
  return ag_peer_row(s, i - s.T);
}

// Item i of a section of `rows` tile rows (the local shard, or the pulls in
// queue order). Swizzled bands let co-running builders share a few A rows and a
// few W columns in L2 instead of streaming all of W for every tile row.
KOSMOS_HD inline gemm::TileCoord ag_section_at(const AgShape& s, int rows, int i) {
  if (s.group <= 1) return {i / s.NT, i % s.NT};
  return gemm::SwizzledOrder{rows, s.NT, s.group}.at(i);
}

KOSMOS_HD inline AgBuild ag_build_item(const AgShape& s, int j) {
  const int local = s.T * s.NT;
  if (j < local) {
    const gemm::TileCoord c = ag_section_at(s, s.T, j);
    return {s.rank, c.m, c.n};
  }
  const gemm::TileCoord c = ag_section_at(s, s.T * (s.tp - 1), j - local);  // c.m: peer row index
  const AgMove m = ag_peer_row(s, c.m);
  return {m.src, m.t, c.n};
}

// One CTA's life, on either engine. `Ops` supplies the CTA-uniform primitives
// (claims broadcast to every thread, the copies, finish) and build_all: run the
// tile engine over the build queue (AgSched: its one claiming thread claims,
// and waits in before_tile for each tile's rows). Movers drain the move queue,
// then build (switching == false: they stop); builders only build, never move.
// Push: a mover announces our gather region free before it claims.
//
// Preconditions (the launchers, csrc/ag_tn_cuda.cu, bulk_ag_nn_cuda.cu): every
// CTA of the grid is resident (one per SM); tp > 1 => movers >= 1; switching ==
// false => 1 <= movers <= grid - 1 when tp > 1 (so a fixed split needs 2 CTAs).
//
// Deadlock freedom. The waits of an epoch: a publish waits on nothing of it
// (guard_data: the previous epoch's readers, done by induction on epochs); a
// pull of (src, t) waits on src's pub[t] (ag_nn, bulk_ag_nn: first on src's
// announcement, made by its CTA 0 before any wait of this epoch, which waits
// only for the previous epoch's ends); a push on the peer's ready[]; a
// builder's tile on the arrived[] of its rows (a peer's) or, where the own
// shard is read from the gather region (the Hopper ag_tn under pull), on
// pub[t]. (1) Movers wait on nothing builders do, and every rank has one,
// resident, so each rank's move queue is claimed to its end by running CTAs.
// (2) On every rank the publishes precede every pull in the queue, so when a
// pull is claimed every publish of its rank has been claimed by a running
// mover, which completes it (it waits on nothing): every pull, on every rank,
// completes. (3) Push: every mover announces before its first claim, waiting
// only on the previous epoch, and each rank has a mover: every push completes.
// (4) So a builder waits only on a move a running mover has claimed or will
// claim (ours: a publish or pull; a peer's: its push) and completes without
// waiting on any builder, whatever the builder holds. Every wait ends, down to
// a grid of one CTA per rank: that CTA is a mover (tp > 1), moves its whole
// queue (its pulls wait only on the peers' publishes, which each peer's one CTA
// runs first), then builds tiles whose rows have all landed. (5) A direct
// source's last CTA waits, after releasing its own done[], for every peer's:
// each peer's CTAs finish by (1)-(4) without anything the source does later.
template <class Tr, class Ops>
KOSMOS_HD void ag_cta(Ops& ops, const AgShape& s, int cta, int grid, int movers, bool switching = true) {
  static_assert(!Tr::kFold, "the fold is GEMM+RS's");
  const int n_move = ag_n_move<Tr>(s);
  const bool mover = initial_role(cta, grid, movers) == Role::kMover;
  if constexpr (Tr::kPush) {
    if (mover && n_move > 0) ops.announce_ready();
  } else {
    if (cta == 0 && n_move > 0) ops.announce_source();
  }
  if (mover)
    for (int i = ops.claim_move(); i < n_move; i = ops.claim_move()) ops.move(ag_move_item<Tr>(s, i), i);
  if (!mover || switching) ops.build_all();
  ops.finish(grid);
}

}  // namespace kosmos
