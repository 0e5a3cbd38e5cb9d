// The AG+GEMM schedule (paper §3.2.1), plain host/device code: the GPU kernel and
// the CPU emulation (tests/host/) run this same function over different `Ops`.
//
// Move queue (per rank), pull transport: T "publish" items (copy local tile row
// t into this rank's slot of its gather buffer, then release pub[t] for the
// peers), then T*(tp-1) "pull" items, tile-row-major and source-minor so every
// link is busy. Publish items precede all pulls, so once a pull is claimed
// anywhere every publish of that rank was claimed earlier by a running CTA: a
// pull only ever waits on claimed work, on every rank.
// Push transport (AgShape::push, Hopper life only): per local tile row t, one
// push per peer (destination-minor), T*(tp-1) items, and no publish: the own
// shard's builders read x itself (tp/ag_gemm_sm90.cuh). A push copies x's row t
// straight into the peer's slot for this rank and releases the peer's arrived
// flag: one NVLink copy per row and no wait on a peer's publish. It waits only
// on the peer's ready[] (its gather region is free this epoch), which the
// peer's movers announce first thing (ag_cta_movers_move).
// Build queue: every tile of the local shard first (its rows come straight from
// x), then peer tiles tile-row-major and source-minor (the pull order; under
// push the order in which each peer's rows leave it).
#pragma once

#include "gemm/tile_order.h"
#include "kosmos/platform.h"
#include "kosmos/roles.h"

namespace kosmos {

struct AgShape {
  int tp, rank;
  int T;      // tile rows per shard
  int NT;     // tile columns of the output
  int group;  // build order: bands of `group` tile rows walked column by column; <= 1: row-major
  int push = 0;  // 1: push transport (ag_cta_movers_move only); 0: pull
};

struct AgMove {
  bool publish;
  int src;  // rank whose shard this tile row belongs to
  int t;    // tile row within that shard
  int dst;  // rank whose gather slot for src it lands in (a push: the peer)
};

struct AgBuild {
  int src, t, tn;
  int move;  // local move item the tile's rows arrive by; -1: the local shard, or a peer's push
};

// With no peers there is nothing to publish or pull; push publishes nothing.
KOSMOS_HD inline int ag_n_move(const AgShape& s) { return s.tp > 1 ? s.T * (s.push ? s.tp - 1 : s.tp) : 0; }
KOSMOS_HD inline int ag_n_build(const AgShape& s) { return s.T * s.NT * s.tp; }

// Peer tile row q of the build order (and pull q): tile-row-major, source-minor.
KOSMOS_HD inline AgMove ag_peer_row(const AgShape& s, int q) {
  const int peers = s.tp - 1;
  return {false, (s.rank + 1 + q % peers) % s.tp, q / peers, s.rank};
}

KOSMOS_HD inline AgMove ag_move_item(const AgShape& s, int i) {
  if (s.push) {
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
    return {s.rank, c.m, c.n, -1};
  }
  const gemm::TileCoord c = ag_section_at(s, s.T * (s.tp - 1), j - local);  // c.m: peer row index
  const AgMove m = ag_peer_row(s, c.m);
  return {m.src, m.t, c.n, s.push ? -1 : s.T + c.m};
}

// Waits until move item q has landed. If q is not claimed yet, this CTA claims
// and runs moves itself (in queue order, so it only ever takes items <= q):
// correctness never depends on how many CTAs are resident.
template <class Ops>
KOSMOS_HD void ag_await_or_move(Ops& ops, const AgShape& s, int q) {
  const int n_move = ag_n_move(s);
  while (!ops.arrived(q)) {
    if (!ops.move_claimed(q)) {
      const int i = ops.claim_move();
      if (i < n_move) ops.move(ag_move_item(s, i), i);
      continue;
    }
    ops.wait_arrived(q);  // claimed by a running CTA: bounded wait
  }
}

// One CTA's life. `Ops` supplies the CTA-uniform primitives (claims broadcast to
// every thread, waits by one thread then a barrier, the copy and the tile GEMM).
// switching == false (a fixed split, to measure what switching buys): a mover
// whose queue is empty stops instead of building; the launcher then keeps at
// least one builder (movers <= grid - 1). Pull transport only: a builder here
// may run the moves its rows need, which a peer's push is not (launchers refuse
// s.push with this life).
template <class Ops>
KOSMOS_HD void ag_cta(Ops& ops, const AgShape& s, int cta, int grid, int movers, bool switching = true) {
  const int n_move = ag_n_move(s), n_build = ag_n_build(s);
  Role role = initial_role(cta, grid, movers);
  if (role == Role::kMover) {
    for (int i = ops.claim_move(); i < n_move; i = ops.claim_move()) ops.move(ag_move_item(s, i), i);
    if (!switching) {
      ops.finish(grid);
      return;
    }
    role = one_way_after_empty(role);
  }
  for (int j = ops.claim_build(); j < n_build; j = ops.claim_build()) {
    const AgBuild b = ag_build_item(s, j);
    if (b.move >= 0) ag_await_or_move(ops, s, b.move);
    ops.build(b);
  }
  // Builders left with nothing to build drain moves nobody needed locally (a
  // publish the peers still wait on), so no item is ever left unclaimed.
  for (int i = ops.claim_move(); i < n_move; i = ops.claim_move()) ops.move(ag_move_item(s, i), i);
  ops.finish(grid);
}

// The life of a CTA whose builders never move: the Hopper engine, where only the
// producer thread claims and waits, so it cannot run a CTA-wide pull. Movers drain
// the move queue, then build; builders claim tiles (ops.build_all) and wait for
// each tile's rows (local: published, peer: arrived). With at least one mover per
// rank (tp > 1) every move is claimed by a CTA that waits only on peer publishes,
// which movers claim first: every builder wait is on claimed work. switching ==
// false: movers stop when their queue is empty (needs 1 <= movers <= grid - 1).
// Push transport: a peer pushes into our gather region only after we announce
// it free (ops.announce_ready: the region's last readers are done, then
// ready[rank] = epoch in every peer's control block). Every mover announces
// before it claims: a mover exists whenever there are peers, and its
// announcement waits on nothing of this launch, so pushes never wait on
// unclaimed work.
template <class Ops>
KOSMOS_HD void ag_cta_movers_move(Ops& ops, const AgShape& s, int cta, int grid, int movers, bool switching = true) {
  const int n_move = ag_n_move(s);
  const bool mover = initial_role(cta, grid, movers) == Role::kMover;
  if (mover && s.push && n_move > 0) ops.announce_ready();
  if (mover)
    for (int i = ops.claim_move(); i < n_move; i = ops.claim_move()) ops.move(ag_move_item(s, i), i);
  if (!mover || switching) ops.build_all();
  ops.finish(grid);
}

}  // namespace kosmos
