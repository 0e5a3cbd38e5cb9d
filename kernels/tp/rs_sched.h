// The GEMM+RS schedule (paper §3.2.2), plain host/device code: the GPU kernels
// (both engines' builders) and the CPU emulation (tests/host/rs_sched_emu.cc)
// run these same functions over different `Ops`. Y_chunk(r) = sum over ranks s
// of (X_s @ W_s)[chunk r].
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
// Push transport (Tr = Push; only the Hopper kernels compile it): builders
// write each partial tile of chunk c straight into rank c's staging and publish
// the band there, so reducers read every rank's partial of their chunk from
// local memory and the NVLink traffic rides in the builders' asynchronous
// epilogue copies. The sum and its order are the same, so the bits are too. A
// peer's staging takes pushes of an epoch once the peer announced it free
// (ready[]): rs_cta.
//
// Fold (Tr = PushFold, Hopper builders): nobody reduces. Step s of the
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
// Deadlock freedom (rs_cta; preconditions there). Builds wait on nothing of
// the current epoch: the staging guard waits on the previous epoch's readers
// (done by induction on epochs), and a push's wait for its owner's ready[] is
// on an announcement every builder makes before it builds. So every claimed
// tile completes, and since every rank has a resident builder that claims the
// GEMM queue to its end, every rank claims every step and publishes every band
// (at the tile_done of the band's last tile: the portable engine's right after
// the tile, the Hopper engine's one tile late, both after work that waits on
// nothing). A reducer waits until its own rank and then each peer has claimed
// step b, then on every rank's band b: all of it the builders' work, which never
// waits on a reducer. The waits for step b form a DAG (reducers -> every
// rank's builders -> nothing).
// Fold, by induction on the band c: an own tile of band c waits only on the
// peers' tiles of their band c (peer parts), which wait on nothing themselves;
// a CTA takes its tiles in claim order, so such a tile can be queued only
// behind tiles claimed before it on its rank: peer-part tiles of bands <= c and
// own tiles of bands <= c - 1 (lag >= 0: own band b is claimed in step b + lag,
// after the peer part of that step), which complete by induction. The engine
// posts a tile to its publisher thread before the next tile's wait (its
// retire), and the publisher waits on nothing else, so no publish waits on
// anything.
// The transport Tr (kosmos/pull.h Pull, kosmos/push.h Push, PushFold) is a
// template parameter of the queues, of where a partial is staged and of rs_cta:
// a kernel compiles one transport's schedule.
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
template <class Tr>
KOSMOS_HD inline bool rs_folds(const RsShape& s, int c) { return Tr::kFold && c == s.rank; }

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

template <class Tr>
KOSMOS_HD inline RsTile rs_build_item(const RsShape& s, int j) {
  if constexpr (Tr::kFold) return rs_fold_item(s, j);
  const int full = s.R * s.NT * s.tp;
  const int b = j / full;  // only the last step may be short, so this is exact
  const int q = j - rs_step_begin(s, b), bt = rs_band_tiles(s, b);
  return {b, rs_chunk_at(s, q / bt), q % bt};
}

// Where queue tile k of band b is: builders take a band column by column
// (RsSched; tiles built at once then share a few W columns across the band's
// rows): row k % rows of the band, column k / rows. The
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

// Where rank `writer`'s partial tiles of chunk c are staged: at rank `home`
// (Tr::home), in the chunk position `pos` of rs_stage_slot and rs_flag_index.
// Pull: at the writer, position c (peers find band (b, c) there). Push: at c,
// position writer (the owner holds one partial of its chunk per rank).
struct RsStaged {
  int home, pos;
};
template <class Tr>
KOSMOS_HD inline RsStaged rs_staged(int writer, int c) {
  return {Tr::home(writer, c), Tr::kPush ? writer : c};
}

KOSMOS_HD inline int rs_slices(const RsShape& s, int b) { return (rs_band_tiles(s, b) + s.slice - 1) / s.slice; }
// Reduce items of a pull or push epoch (the fold has no reduce queue: rs_cta).
KOSMOS_HD inline int rs_n_reduce(const RsShape& s) {
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

// One CTA's life, on either engine. `Ops` supplies CTA-uniform primitives
// (claims broadcast to every thread, waits by one thread then a barrier, the
// reduction, finish) and build_all: the staging guard, then the tile engine over
// the GEMM queue (RsSched: its one claiming thread claims, marking each step
// claimed as its last tile is claimed; the staging epilogue writes the partial,
// tile_done counts it into its band and the band's last tile publishes it).
// Builders build until the GEMM queue is empty, then reduce (one way;
// switching == false: they stop). Reducers never build: they wait until this
// rank has claimed the step, then on every rank's band.
// Preconditions (csrc/tn_rs_cuda.cu): every CTA of the grid is resident (one per
// SM); rs_initial_role keeps at least one builder; switching == false needs
// 1 <= reducers <= grid - 1, so 2 CTAs. A grid of one CTA per rank is a builder
// that builds every tile and then reduces (its waits are on bands each peer's
// one CTA builds without waiting).
// Push: every builder first announces this rank's staging free for the epoch
// (ops.announce_ready: its last readers are done, then ready[rank] = epoch at
// every peer); a builder waits on a peer's announcement before its first tile of
// that peer's chunk. A builder exists on every rank and announces before it
// waits on anything of this epoch, so those waits are on work that happens.
template <class Tr, class Ops>
KOSMOS_HD void rs_cta(Ops& ops, const RsShape& s, int cta, int grid, int reducers, bool switching = true) {
  if (rs_initial_role(cta, grid, reducers) == Role::kBuilder) {
    if constexpr (Tr::kPush)
      if (s.tp > 1) ops.announce_ready();
    ops.build_all();
    if (!switching) {
      ops.finish(grid);
      return;
    }
  }
  if constexpr (!Tr::kFold) {  // the fold has no reduce queue: its kernel compiles no reducer
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
  }
  ops.finish(grid);
}

}  // namespace kosmos
