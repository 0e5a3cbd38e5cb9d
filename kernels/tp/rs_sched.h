// The GEMM+RS schedule (paper §3.2.2), plain host/device code: the GPU kernel and
// the CPU emulation (tests/host/rs_sched_emu.cc) run these same functions over
// different `Ops`. Y_chunk(r) = sum over ranks s of (X_s @ W_s)[chunk r].
//
// Units. A chunk is the T tile rows of output rank c owns; a band is R tile rows
// of a chunk (the last band may be shorter); step b is band b of every chunk.
// GEMM queue (per rank): band-major, step 0 first; within a step the chunks
// rotate from rank+1 and end with our own chunk, so at any moment the ranks are
// filling different peers' chunks. Builders write fp32 partial tiles into this
// rank's staging buffer; the builder that completes band (b, c) publishes it.
// Reduce queue (per rank): band b of our own chunk in slices, band-major. A
// reducer pulls the slice from every rank once it has landed, sums ranks 0..tp-1
// in that fixed order in fp32 and rounds once.
// Push transport (RsShape::push, Hopper life only): builders write each partial
// tile of chunk c straight into rank c's staging and publish the band there, so
// reducers read every rank's partial of their chunk from local memory and the
// NVLink traffic rides in the builders' asynchronous epilogue copies. The sum and
// its order are the same, so the bits are too. A peer's staging takes pushes of
// an epoch once the peer announced it free (ready[]): rs_cta_builders_build.
//
// Fold (RsShape::fold, push only, Hopper life): nobody reduces. Step s of the
// queue is the peers' band s (tp - 1 chunks, rotated as above), then our own
// band s - lag; an own tile waits until every peer has published that band
// here, adds the peers' pushed partials to its own in rank order and rounds
// once into Y (the same sum, so the same bits). Our own chunk is never staged,
// and the reduction rides in the builders' epilogues. The lag (RsShape::lag,
// csrc/tn_rs_cuda.cu rs_fold_lag) keeps own band b far enough behind the
// peers' band b that it is published when wanted (bands complete a grid of
// tiles after their claims, and the engine publishes one tile late), and close
// enough that the pushed partials are still in L2 when read: with every own
// band last (lag >= bands) they were read back from DRAM, which cost the
// one-GPU loopback 3-7% on thin K (2026-12-01, benchmarks/RESULTS.md).
//
// Deadlock freedom (any number of resident CTAs, down to 1): a CTA never waits on
// a band (local or remote) before its own rank has claimed every tile of that
// step; if the step is not claimed yet it claims and builds the tiles itself.
// Builds wait on nothing in the current epoch, so every claimed tile completes,
// and each rank claims its steps in order without needing any peer: the waits
// for step b form a DAG (reducers -> every rank's step b -> nothing).
// Fold, by induction on the band c: an own tile of band c waits only on the
// peers' tiles of their band c (peer parts), which wait on nothing themselves;
// a CTA takes its tiles in claim order, so such a tile can be queued only
// behind tiles claimed before it on its rank: peer-part tiles of bands <= c and
// own tiles of bands <= c - 1 (lag >= 0: own band b is claimed in step b + lag,
// after the peer part of that step), which complete by induction. The engine
// posts a tile to its publisher thread before the next tile's wait (its
// retire), and the publisher waits on nothing else, so no publish waits on
// anything.
#pragma once
#include <cstdint>

#include "kosmos/platform.h"
#include "kosmos/roles.h"

namespace kosmos {

struct RsShape {
  int tp, rank;
  int T;      // tile rows per chunk (rows this rank owns after the RS / tile M)
  int NT;     // tile columns of the output
  int R;      // tile rows per band
  int slice;  // tiles per reduce item (R * NT or more: a reducer owns a whole band)
  int push = 0;  // 1: push transport (rs_cta_builders_build only); 0: pull
  int fold = 0;  // 1 (with push): own chunk folded into the builders' epilogues, no reducers
  int lag = 0;   // fold: steps by which our own band trails the peers' (>= 0)
};

struct RsTile {
  int band, chunk;
  int k;  // tile within the band, row-major: tile row band*R + k/NT, column k%NT
};

struct RsSlice {
  int band, k0, n;  // tiles [k0, k0 + n) of band `band` of our own chunk
};

KOSMOS_HD inline int rs_bands(const RsShape& s) { return (s.T + s.R - 1) / s.R; }
KOSMOS_HD inline int rs_band_rows(const RsShape& s, int b) { return s.T - b * s.R < s.R ? s.T - b * s.R : s.R; }
KOSMOS_HD inline int rs_band_tiles(const RsShape& s, int b) { return rs_band_rows(s, b) * s.NT; }
KOSMOS_HD inline int rs_n_build(const RsShape& s) { return s.T * s.NT * s.tp; }
// Every step before the last is full, so step b starts at b * R * NT * tp.
KOSMOS_HD inline int rs_step_begin(const RsShape& s, int b) { return b * s.R * s.NT * s.tp; }
KOSMOS_HD inline int rs_step_end(const RsShape& s, int b) {
  return b + 1 == rs_bands(s) ? rs_n_build(s) : rs_step_begin(s, b + 1);
}
// Chunk produced i-th within a step: ours last, so the peers' chunks go first.
KOSMOS_HD inline int rs_chunk_at(const RsShape& s, int i) { return (s.rank + 1 + i) % s.tp; }

// Fold: whether tile rows of chunk c are summed in their builder's epilogue.
KOSMOS_HD inline bool rs_folds(const RsShape& s, int c) { return s.fold && c == s.rank; }

// Tiles in bands [0, n) of one chunk (n clamped to [0, bands]).
KOSMOS_HD inline int rs_tiles_in_bands(const RsShape& s, int n) {
  const int B = rs_bands(s);
  if (n <= 0) return 0;
  return n < B ? n * s.R * s.NT : s.T * s.NT;
}
// Fold: queue position of step st's first tile (steps 0 .. bands + lag - 1).
KOSMOS_HD inline int rs_fold_step_begin(const RsShape& s, int st) {
  return (s.tp - 1) * rs_tiles_in_bands(s, st) + rs_tiles_in_bands(s, st - s.lag);
}

// Fold's queue item j: the step by binary search over rs_fold_step_begin
// (monotone), then the peers' band of the step or our own trailing band.
KOSMOS_HD inline RsTile rs_fold_item(const RsShape& s, int j) {
  int lo = 0, hi = rs_bands(s) + s.lag;  // rs_fold_step_begin(lo) <= j < rs_fold_step_begin(hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (rs_fold_step_begin(s, mid) <= j) lo = mid; else hi = mid;
  }
  const int q = j - rs_fold_step_begin(s, lo);
  if (lo < rs_bands(s)) {
    const int bt = rs_band_tiles(s, lo);
    if (q < (s.tp - 1) * bt) return {lo, rs_chunk_at(s, q / bt), q % bt};
    return {lo - s.lag, s.rank, q - (s.tp - 1) * bt};
  }
  return {lo - s.lag, s.rank, q};
}

KOSMOS_HD inline RsTile rs_build_item(const RsShape& s, int j) {
  if (s.fold) return rs_fold_item(s, j);
  const int full = s.R * s.NT * s.tp;
  const int b = j / full;  // only the last step may be short, so this is exact
  const int q = j - rs_step_begin(s, b), bt = rs_band_tiles(s, b);
  return {b, rs_chunk_at(s, q / bt), q % bt};
}

// Where queue tile k of band b is, for builders that take a band column by
// column (the Hopper builders: tiles built at once then share a few W columns
// across the band's rows): row k % rows of the band, column k / rows. The
// staging keeps the row-major index rs_band_index; any bijection works, since
// bands complete and steps are claimed by count.
struct RsBandTile {
  int row, col;  // tile row within the band, tile column
};
KOSMOS_HD inline RsBandTile rs_band_tile_colmajor(const RsShape& s, int b, int k) {
  const int rows = rs_band_rows(s, b);
  return {k % rows, k / rows};
}
KOSMOS_HD inline int rs_band_index(const RsShape& s, int row, int col) { return row * s.NT + col; }

// Staging slot (in tiles) of band b, chunk c, tile k: band-major like the queue,
// but chunk-ordered (not rotated) so a peer finds band (b, c) without knowing our
// rank, as one contiguous block it can pull in a single copy.
KOSMOS_HD inline int rs_stage_slot(const RsShape& s, int b, int c, int k) {
  return rs_step_begin(s, b) + c * rs_band_tiles(s, b) + k;
}

// Where rank `writer`'s partial tiles of chunk c are staged: at rank `home`, in
// the chunk position `pos` of rs_stage_slot and rs_flag_index. Pull: at the
// writer, position c (peers find band (b, c) there). Push: at c, position writer
// (the owner holds one partial of its chunk per rank).
struct RsStaged {
  int home, pos;
};
// (push as a parameter: the Hopper kernels pass their compile-time kPush.)
KOSMOS_HD inline RsStaged rs_staged(bool push, int writer, int c) {
  return push ? RsStaged{c, writer} : RsStaged{writer, c};
}
KOSMOS_HD inline RsStaged rs_staged(const RsShape& s, int writer, int c) { return rs_staged(s.push != 0, writer, c); }

KOSMOS_HD inline int rs_slices(const RsShape& s, int b) { return (rs_band_tiles(s, b) + s.slice - 1) / s.slice; }
KOSMOS_HD inline int rs_n_reduce(const RsShape& s) {
  if (s.fold) return 0;
  const int B = rs_bands(s);
  return (B - 1) * rs_slices(s, 0) + rs_slices(s, B - 1);
}

KOSMOS_HD inline RsSlice rs_reduce_item(const RsShape& s, int q) {
  const int per = rs_slices(s, 0), B = rs_bands(s);
  const int b = q / per < B - 1 ? q / per : B - 1;
  const int k0 = (q - b * per) * s.slice, bt = rs_band_tiles(s, b);
  return {b, k0, bt - k0 < s.slice ? bt - k0 : s.slice};
}

// The fixed-order reduction of n elements: src(r, i) is rank r's fp32 partial,
// dst(i, sum) rounds once to the output type. The sum starts from rank 0's value
// (not 0.0f, which would turn -0.0 into +0.0) and adds ranks 1..tp-1 in order, so
// the result is a function of the data alone, bitwise, whoever computes it.
// Threads split elements (first, step); one element is never split.
template <class Src, class Dst>
KOSMOS_HD void rs_reduce_fixed(int tp, uint32_t n, uint32_t first, uint32_t step, const Src& src, const Dst& dst) {
  for (uint32_t i = first; i < n; i += step) {
    float acc = src(0, i);
    for (int r = 1; r < tp; ++r) acc += src(r, i);
    dst(i, acc);
  }
}

// Builds GEMM tile j into staging, without counting it into its band (see
// rs_tile_done). The first staging write of a CTA waits until every peer has
// finished reading our previous epoch (done[p] >= epoch - 1): that wait depends
// only on last epoch's work, never on this one's.
template <class Ops>
KOSMOS_HD RsTile rs_build_tile(Ops& ops, const RsShape& s, int j, bool& staging_free) {
  const RsTile t = rs_build_item(s, j);
  if (!s.fold && j + 1 == rs_step_end(s, t.band)) ops.mark_step_claimed(t.band);  // claim done, build pending
  if (!staging_free) {
    for (int p = 0; p < s.tp; ++p)
      if (p != s.rank) ops.wait_peer_done(p);
    staging_free = true;
  }
  ops.build(t);
  return t;
}

// Counts a staged tile into its band. band_add is acq_rel: the builder that
// completes the band has acquired every other builder's tile stores, so its
// release of pub[] covers the whole band. The Hopper engine calls this one tile
// late (its staged epilogue's copies overlap the next tile): nothing a builder
// waits for may depend on it.
// Folded tiles are not staged: there is nothing to count or publish.
template <class Ops>
KOSMOS_HD void rs_tile_done(Ops& ops, const RsShape& s, const RsTile& t) {
  if (rs_folds(s, t.chunk)) return;
  if (ops.band_add(t.band, t.chunk) + 1 == (uint32_t)rs_band_tiles(s, t.band)) ops.publish(t.band, t.chunk);
}

// Builds GEMM tile j and counts it at once (portable builders).
template <class Ops>
KOSMOS_HD void rs_build(Ops& ops, const RsShape& s, int j, bool& staging_free) {
  rs_tile_done(ops, s, rs_build_tile(ops, s, j, staging_free));
}

// Reduces slice q. Before any wait for band b this rank must have claimed all of
// step b; a reducer that finds it unclaimed claims and builds tiles itself (in
// queue order: tiles of step b or earlier, at most one past it if another CTA
// claims the step's last tile meanwhile, which is harmless). Remote bands are waited on
// only once the peer says the step is claimed, so pub[] waits are on claimed work.
template <class Ops>
KOSMOS_HD void rs_reduce(Ops& ops, const RsShape& s, int q, bool& staging_free) {
  const RsSlice sl = rs_reduce_item(s, q);
  const int need = rs_step_end(s, sl.band), n_build = rs_n_build(s);
  while (!ops.build_claimed(need - 1)) {
    const int j = ops.claim_build();
    if (j < n_build) rs_build(ops, s, j, staging_free);
  }
  for (int src = 0; src < s.tp; ++src) {
    if (src != s.rank) ops.wait_step_claimed(src, sl.band);
    ops.wait_band(src, sl.band);
  }
  ops.reduce(sl);
}

// One CTA's life. `Ops` supplies CTA-uniform primitives: claims broadcast to every
// thread, waits by one thread then a barrier, the tile GEMM and the reduction.
// No drain is needed at the end: whoever claims the last reduce slice first makes
// sure the last step, hence every GEMM tile, is claimed. switching == false (a
// fixed split): a builder whose queue is empty stops instead of reducing; the
// launcher then keeps at least one reducer and one builder. Pull transport only
// (launchers refuse s.push with this life).
template <class Ops>
KOSMOS_HD void rs_cta(Ops& ops, const RsShape& s, int cta, int grid, int reducers, bool switching = true) {
  const int n_build = rs_n_build(s), n_reduce = rs_n_reduce(s);
  bool staging_free = false;
  Role role = rs_initial_role(cta, grid, reducers);
  for (;;) {
    if (role == Role::kBuilder) {
      const int j = ops.claim_build();
      if (j < n_build) rs_build(ops, s, j, staging_free);
      else if (switching) role = rs_after_build_empty(role);
      else break;
      continue;
    }
    const int q = ops.claim_reduce();
    if (q >= n_reduce) break;
    rs_reduce(ops, s, q, staging_free);
  }
  ops.finish(grid);
}

// The life of a CTA whose builders are the Hopper engine: only its producer
// thread claims, so a reducer cannot build the tiles its band needs. Builders
// (ops.build_all: claim until the GEMM queue is empty, marking each step claimed
// and publishing completed bands) then reduce, one way. Reducers wait until this
// rank has claimed the step (builders never wait on current-epoch work, and at
// least one CTA starts as a builder: rs_initial_role), then on every rank's band.
// switching == false: builders stop when the GEMM queue is empty (needs
// 1 <= reducers <= grid - 1).
// Push: every builder first announces this rank's staging free for the epoch
// (ops.announce_ready: its last readers are done, then ready[rank] = epoch at
// every peer); a builder waits on a peer's announcement before its first tile of
// that peer's chunk. A builder exists on every rank and announces before it
// waits on anything of this epoch, so those waits are on work that happens.
template <class Ops>
KOSMOS_HD void rs_cta_builders_build(Ops& ops, const RsShape& s, int cta, int grid, int reducers,
                                     bool switching = true) {
  if (rs_initial_role(cta, grid, reducers) == Role::kBuilder) {
    if (s.push && s.tp > 1) ops.announce_ready();
    ops.build_all();
    if (!switching) {
      ops.finish(grid);
      return;
    }
  }
  const int n_reduce = rs_n_reduce(s);
  for (int q = ops.claim_reduce(); q < n_reduce; q = ops.claim_reduce()) {
    const RsSlice sl = rs_reduce_item(s, q);
    ops.wait_build_claimed(rs_step_end(s, sl.band) - 1);
    for (int src = 0; src < s.tp; ++src) {
      if (src != s.rank) ops.wait_step_claimed(src, sl.band);
      ops.wait_band(src, sl.band);
    }
    ops.reduce(sl);
  }
  ops.finish(grid);
}

}  // namespace kosmos
