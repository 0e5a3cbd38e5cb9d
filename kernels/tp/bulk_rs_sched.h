// The bulk RS || NT schedule (paper §3.2, Figure 5: the column-parallel weight
// gradient), plain host/device code: the GPU kernels (tp/bulk_rs.cuh,
// tp/bulk_rs_sm90.cuh) and the CPU emulation (tests/host/bulk_rs_sched_emu.cc)
// run these same functions over different `Ops`. Two independent jobs share one
// launch: dx_chunk(r) = sum over ranks s of dx_partial_s[chunk r] (the
// reduce-scatter) and dw = x_gathered^T @ dy (the wgrad GEMM, which needs
// nothing from the RS).
//
// Units. A chunk is the `rows` rows of dx_partial that rank c owns after the RS
// ([tp * rows, cols] rank-major, chunk c = rows [c * rows, (c + 1) * rows)); a
// band is band_rows rows of a chunk (the last may be shorter), the unit a flag
// covers; a slice is a part of a band's elements, the unit a reducer sums.
// Push queue (per rank): band-major and destination-minor, band b going to
// rank + 1, rank + 2, ... in turn, so consecutive movers feed different links.
// A push copies band b of chunk dst of our dx_partial into dst's staging slot
// for us, then releases dst's pub[b][rank]. GEMM queue: every tile of dw, in
// the L2-swizzled order. Reduce queue: our own chunk's slices, band-major.
//
// Roles (kosmos/roles.h initial_role). Movers start on the push queue; every
// CTA builds GEMM tiles once the push queue is empty (movers become builders);
// a CTA whose GEMM queue is empty first drains any push nobody claimed, then
// reduces. switching == false (a fixed split, a benchmark arm): movers do all
// of the RS (push, then reduce) and builders only build, so the communication
// and the GEMM keep disjoint CTAs, as fixed-role overlap libraries do; the
// launcher keeps 1 <= movers <= grid - 1.
//
// Deadlock freedom (any number of resident CTAs per rank, down to 1). The waits
// of an epoch are: a push waits on its destination's ready[] (the destination
// announced its staging free); a reduce waits on every peer's push of that band
// to us; builds wait on nothing; the announcement waits only on the previous
// epoch's readers (tp/heap_use.cuh), which finish by induction on epochs.
// (1) Every CTA announces before its first wait of the epoch (bulk_rs_push_all),
// and a CTA reaches its first wait only through builds, which never block; so
// each rank announces as soon as any of its CTAs leaves the GEMM queue or starts
// as a mover, and every push completes. (2) A CTA reduces only after its rank's
// push queue is exhausted (the drain), so on every rank each push is claimed by
// a running CTA before any CTA there reduces; by (1) it completes. A reducer's
// waits are therefore on pushes that complete, whatever the residency. In the
// fixed split the movers alone push, and at least one exists per rank.
// Direct sources (BulkRsShape::direct): a rank whose partials its peers read
// straight from dx_partial pushes nothing. Every CTA's announcement also says
// where a rank's partials are (waiting, as it does, only for the previous
// epoch's ends), and a reducer waits on that (then, for a source that pushes, on
// its band's push): by (1) it is made. A direct source's last CTA waits for
// every peer's done[] of the epoch, which each peer releases once its CTAs are
// done, by the above, whatever we do later.
#pragma once
#include <cstddef>
#include <cstdint>

#include "gemm/tile_order.h"
#include "kosmos/platform.h"
#include "kosmos/roles.h"

namespace kosmos {

struct BulkRsShape {
  int tp, rank;
  int rows;       // rows per chunk: this rank's rows of dx after the RS
  int cols;       // elements per row (k)
  int band_rows;  // rows per band, a multiple of 8 (16-byte aligned bands for 2-byte types)
  int slices;     // reduce items per band
  int tiles_m, tiles_n, group;  // GEMM: tiles of dw [k, n] and its swizzle band (gemm::SwizzledOrder)
  int direct;     // 1: the peers read our partials straight from dx_partial (no pushes of ours)
};

struct BulkPush {
  int band, dst;  // band `band` of chunk `dst`, into dst's staging
};

struct BulkSlice {
  int band;
  int e0, e1;  // elements [e0, e1) of the band (row-major from the band's first row)
};

KOSMOS_HD inline int bulk_bands(const BulkRsShape& s) { return (s.rows + s.band_rows - 1) / s.band_rows; }
KOSMOS_HD inline int bulk_band_row0(const BulkRsShape& s, int b) { return b * s.band_rows; }
KOSMOS_HD inline int bulk_band_len(const BulkRsShape& s, int b) {
  const int left = s.rows - b * s.band_rows;
  return left < s.band_rows ? left : s.band_rows;
}

KOSMOS_HD inline int bulk_n_push(const BulkRsShape& s) { return s.tp > 1 && !s.direct ? bulk_bands(s) * (s.tp - 1) : 0; }
KOSMOS_HD inline BulkPush bulk_push_item(const BulkRsShape& s, int i) {
  return {i / (s.tp - 1), (s.rank + 1 + i % (s.tp - 1)) % s.tp};
}

KOSMOS_HD inline int bulk_n_gemm(const BulkRsShape& s) { return s.tiles_m * s.tiles_n; }
KOSMOS_HD inline gemm::TileCoord bulk_gemm_tile(const BulkRsShape& s, int j) {
  return gemm::SwizzledOrder{s.tiles_m, s.tiles_n, s.group > 0 ? s.group : 1}.at(j);
}
// The GEMM queue as an order (tp/queue_sched.h). The shape is read where it
// lies (the kernel parameters), not copied: the Hopper producer runs on 40
// registers, and a copy held there spilled (ptxas).
struct BulkRsGemmOrder {
  const BulkRsShape& s;
  KOSMOS_HD int count() const { return bulk_n_gemm(s); }
  KOSMOS_HD gemm::TileCoord at(int j) const { return bulk_gemm_tile(s, j); }
};

KOSMOS_HD inline int bulk_n_reduce(const BulkRsShape& s) { return bulk_bands(s) * s.slices; }
// Slice q: a band's elements cut into `slices` runs of a multiple of 8
// elements (16-byte aligned runs); trailing slices of a short band may be empty.
KOSMOS_HD inline BulkSlice bulk_reduce_item(const BulkRsShape& s, int q) {
  const int b = q / s.slices, k = q % s.slices;
  const int n = bulk_band_len(s, b) * s.cols;
  const int per = ((n + s.slices - 1) / s.slices + 7) / 8 * 8;
  const int e0 = k * per < n ? k * per : n;
  return {b, e0, e0 + per < n ? e0 + per : n};
}

// Where writer w's partial of home h's chunk is staged at h: slot w, skipping
// h's own (its reducers read their own partial straight from dx_partial).
KOSMOS_HD inline int bulk_stage_pos(int writer, int home) { return writer < home ? writer : writer - 1; }

// The communication phase's first step: announce our staging free (a CTA's
// first communication phase, before any wait of the epoch), then claim pushes
// until none is left.
template <class Ops>
KOSMOS_HD void bulk_rs_push_all(Ops& ops, const BulkRsShape& s, bool announce) {
  if (announce && s.tp > 1) ops.announce_ready();
  const int n = bulk_n_push(s);
  for (int i = ops.claim_push(); i < n; i = ops.claim_push()) ops.push(bulk_push_item(s, i), i);
}

// Pushes (those left), then reduces: only after this rank's push queue is
// exhausted, so every push a peer's reducer waits for is claimed by a running CTA.
template <class Ops>
KOSMOS_HD void bulk_rs_comm(Ops& ops, const BulkRsShape& s, bool announce) {
  bulk_rs_push_all(ops, s, announce);
  const int n = bulk_n_reduce(s);
  for (int q = ops.claim_reduce(); q < n; q = ops.claim_reduce()) ops.reduce(bulk_reduce_item(s, q));
}

// One CTA's life. `Ops` supplies CTA-uniform primitives: claims broadcast to
// every thread, waits by one thread then a barrier, the copies, the sums and
// build_all (claim GEMM tiles until the queue is empty: the portable engine's
// thread 0 or the Hopper engine's claimer thread claims; no CTA-wide work runs
// inside it, which is why movers and reducers are roles outside it). A mover
// announces before its pushes, anyone else before its drain; nothing of the
// CTA's state but its role lives across build_all (the Hopper producer warp group runs it
// on 40 registers).
template <class Ops>
KOSMOS_HD void bulk_rs_cta(Ops& ops, const BulkRsShape& s, int cta, int grid, int movers, bool switching = true) {
  const bool mover = initial_role(cta, grid, movers) == Role::kMover;
  if (mover) bulk_rs_push_all(ops, s, true);
  if (!mover || switching) ops.build_all();
  if (mover || switching) bulk_rs_comm(ops, s, !mover);
  ops.finish(grid);
}

}  // namespace kosmos
