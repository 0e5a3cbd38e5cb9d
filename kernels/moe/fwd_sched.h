// The MoE forward megakernel's schedule (paper §3.3.1, Figure 6), plain
// host/device code: the GPU kernel and the CPU emulation
// (tests/host/moe_fwd_sched_emu.cc) run moe_fwd_cta over different `Ops`. The
// backward runs the same CTA life with a build queue of its own
// (moe/bwd_queues.h).
// Shapes, arenas, capacity and the layout: moe/fwd_layout.h; the items of each
// queue: moe/fwd_queues.h. Queues of one rank, in the order CTAs take them:
//
//  front    route block b (b < nb): its router logits (X W_r^T, fp32), its
//           tokens' routing (route.h), plan_histogram of its row;
//           the last block routed runs plan_scan and sends this rank's counts[E]
//           to every rank: the count exchange, the forward's one cross-rank
//           barrier. Then scatter block b (plan_scatter, after the scan), then
//           one layout item: wait for every rank's counts, build MoeLayout.
//  move     dispatch parts (x, g, d): this rank's rows for expert d*E_l + x from
//           token group g (G groups of whole plan blocks) pushed into their final
//           row of d's receive arena. Expert-major (the order GEMM1 consumes),
//           group, then destination-minor, rotated from rank + 1 and ending with
//           our own, so consecutive parts go down different links. The last of a
//           (source, expert)'s G parts releases arrived[source, x] at d.
//           EP = 1 (and our own share at EP > 1): the part is one local gather
//           into the arena. Why a copy rather than builders gathering A rows:
//           every GEMM1 row block is read by nt1 tiles, so one copy costs less
//           than nt1 gathers, the Hopper engine reads A with TMA, which needs
//           the rows contiguous, and the grouped rows are the backward's X.
//           The backward at EP > 1 (s.x_parts) then pushes the same parts again
//           with the forward's input rows into d's X arena, releasing
//           x_arrived[source, x]: the forward's arena is in the heap, which the
//           next MoE launch (the next layer's) overwrites, so its X rows do not
//           outlive the forward; sent after every dY part, in link time the
//           backward leaves idle (paper §3.3.2), they are read only by wgrad1.
//  build    GEMM1 tiles (row block, column block of 2I as SwiGLU pairs: each
//           tile holds the gate and up columns of the same I columns), then GEMM2
//           tiles (row block, column block of H); routed row blocks are
//           expert-major. The shared expert, when there is one, is row blocks
//           of its own: tokens in order, read straight from x (moe_build_item),
//           its GEMM1 tiles first; where every expert holds at most one row
//           block, spread evenly among the routed tiles of each GEMM instead
//           (moe_mixes_shared: routed tiles then wait on memory, shared ones on
//           the tensor cores).
//           A GEMM1 tile waits only on the sources whose rows its row block
//           holds (a shared one on nothing); a GEMM2 tile on its row block's
//           GEMM1 (all nt1 tiles).
//  combine  units (x, s): expert x's rows from source s, pushed back into s's
//           return buffer once their row blocks' GEMM2 tiles are done (expert-
//           major, destination-minor as above). Our own units copy nothing: the
//           fold reads those rows in the arena. Each releases returned[e] at s.
//  fold     a part of token block b (kMoeFoldParts per block), once every unit
//           holding the block's rows has returned (and the shared expert's
//           GEMM2 row blocks of its tokens): each token's k rows weighted by
//           fp32 router weights, summed in fp32 in slot order (moe_fold_token),
//           then the shared expert's row (weight 1), rounded once.
//
// Memory model. Flags hold epochs (never reset: ready is flag >= epoch); a
// producer writes, barriers its CTA, then one thread releases (.sys when the
// reader is another GPU); consumers acquire. Every wait polls local memory: all
// cross-rank traffic is pushed. Counters (MoeCount) are local u32s; the add
// that completes one re-arms it to 0 and then releases the flag, as RS's band
// counts publish a band; queue counters are re-armed by the last CTA (finish).
// Reuse across epochs: a rank sends its counts to d only once d has stored
// ready[us] >= epoch, which d's CTA 0 does first thing in a launch (d's previous
// launch, every reader of d's buffers, is over). Every later write into d
// (arena rows, units) follows our layout item, which waited for d's counts of
// this epoch, so d is in this launch: no wait of its own. Every write into d is
// awaited by d in that epoch (units without rows write nothing), so d never
// leaves an epoch with our writes still in flight.
#pragma once

#include "kosmos/platform.h"
#include "kosmos/roles.h"
#include "moe/fwd_layout.h"
#include "moe/fwd_queues.h"

namespace kosmos::moe {

// The CTA life inlines whole into its kernel: ptxas serialises every wgmma of
// a kernel that makes a call (C7510), and a Hopper kernel's build() holds the
// tile engine.
#define KOSMOS_MOE_INLINE KOSMOS_HD inline __attribute__((always_inline))

// ---- role policy ------------------------------------------------------------------
// Every CTA runs the front and, at its end, the combine queue and the fold.
// Movers (the first `movers` CTAs, at least one: only movers dispatch) drain the
// move queue, then switch two ways: push a ready unit, else build a tile.
// Builders build until the GEMM queue is empty, then push units (one way).
KOSMOS_HD inline Role moe_initial_role(int cta, int grid, int movers) {
  const int m = movers < 1 ? 1 : movers > grid ? grid : movers;
  return cta < m ? Role::kMover : Role::kBuilder;
}

enum class MoeStep : int { kPush, kBuild, kWait };
// A two-way mover holding unit u: push it if ready, else build while tiles are
// left, else wait for it (every tile it needs is claimed by then).
KOSMOS_HD inline MoeStep moe_two_way_step(bool unit_ready, bool tiles_left) {
  return unit_ready ? MoeStep::kPush : tiles_left ? MoeStep::kBuild : MoeStep::kWait;
}

// ---- one CTA's life -------------------------------------------------------------
// `Ops` supplies CTA-uniform primitives: claim(queue); count(counter, i, target)
// (add one; true for the add that completes it, which re-arms it); release(flag,
// home, i) (flag i at rank home = epoch); wait(flag, i) (bounded) and test(flag,
// i) on our own flags; wait_each(flag, n, pred): wait(flag, i) for every i < n
// with pred(i), in any order (a CTA polls them in parallel); ends() (plan ends
// [nb][E], after kPlanned); layout() and local_layout() (after kLaidOut: the
// copy the CTA reads for the rest of its life); and the work: route, scan, send_counts,
// scatter, build_layout, push_part, build(L, most) (the GEMM tiles, MoeBuilds
// below), push_unit, fold(item, first, last) (fold item `item`: tokens
// [first, last)), finish.

// The last route block: scan, then the count exchange (our own row last).
template <class Ops>
KOSMOS_MOE_INLINE void moe_scan_and_send(Ops& ops, const MoeFwdShape& s) {
  ops.scan();
  ops.release(MoeFlag::kScanned, s.rank, 0);
  for (int i = 0; i < s.ep; ++i) {
    const int d = moe_rotated(s, i);
    ops.wait(MoeFlag::kReady, d);
    ops.send_counts(d);
    ops.release(MoeFlag::kCounts, d, s.rank);
  }
}

template <class Ops>
KOSMOS_MOE_INLINE void moe_front(Ops& ops, const MoeFwdShape& s) {
  const int nb = moe_blocks(s), n = moe_n_front(s);
  for (int i = ops.claim(MoeQueue::kFront); i < n; i = ops.claim(MoeQueue::kFront)) {
    if (i < nb) {
      ops.route(i);
      if (ops.count(MoeCount::kRouted, 0, nb)) moe_scan_and_send(ops, s);
    } else if (i < 2 * nb) {
      ops.wait(MoeFlag::kScanned, 0);
      ops.scatter(i - nb);
      if (ops.count(MoeCount::kScattered, 0, nb)) ops.release(MoeFlag::kPlanned, s.rank, 0);
    } else {
      for (int r = 0; r < s.ep; ++r) ops.wait(MoeFlag::kCounts, r);
      ops.build_layout();
      ops.release(MoeFlag::kLaidOut, s.rank, 0);
    }
  }
  ops.wait(MoeFlag::kPlanned, 0);
  ops.wait(MoeFlag::kLaidOut, 0);
}

template <class Ops>
KOSMOS_MOE_INLINE void moe_dispatch(Ops& ops, const MoeFwdShape& s) {
  const int n = moe_n_move(s);
  for (int q = ops.claim(MoeQueue::kMove); q < n; q = ops.claim(MoeQueue::kMove)) {
    const MoeMove m = moe_move_item(s, q);
    ops.push_part(m);
    if (ops.count(m.xrows ? MoeCount::kXParts : MoeCount::kParts, m.dst * s.e_local + m.x, s.groups))
      ops.release(m.xrows ? MoeFlag::kXArrived : MoeFlag::kArrived, m.dst, s.rank * s.e_local + m.x);
  }
}

// The build queue as a tile source that a tile engine drives: next() claims,
// start(t) waits for the rows tile t reads, done(t) completes it. The Hopper
// engine pipelines the three (its claimer thread claims ahead and waits, its
// publisher thread completes a tile once its stores have landed), so `Ops` here
// is the one-thread view of the control words; moe_build_serial runs them in
// order over CTA-wide Ops, as the portable kernel (moe/fwd_portable.cuh), the
// emulators and the compile check do.
template <class Ops>
struct MoeBuilds {
  Ops& ops;
  const MoeFwdShape& s;
  const MoeLayout& L;

  KOSMOS_MOE_INLINE bool next(MoeTile* t) {
    const int j = ops.claim(MoeQueue::kBuild);
    if (j >= moe_n_build(s, L)) return false;
    *t = moe_build_item(s, L, j);
    return true;
  }
  // A GEMM1 tile waits only on the sources whose rows its row block holds; a
  // GEMM2 tile on its row block's GEMM1 (all nt1 tiles).
  KOSMOS_MOE_INLINE void start(const MoeTile& t) {
    if (t.gemm == 1) {
      if (t.x == s.e_local) return;  // the shared expert reads x
      for (int src = 0; src < s.ep; ++src)
        if (moe_reads(s, L, t.x, t.rb, src)) ops.wait(MoeFlag::kArrived, src * s.e_local + t.x);
    } else {
      ops.wait(MoeFlag::kGemm1, t.rb);
    }
  }
  KOSMOS_MOE_INLINE void done(const MoeTile& t) {
    if (t.gemm == 1) {
      if (ops.count(MoeCount::kGemm1, t.rb, s.nt1)) ops.release(MoeFlag::kGemm1, s.rank, t.rb);
    } else {
      if (ops.count(MoeCount::kGemm2, t.rb, s.nt2)) ops.release(MoeFlag::kGemm2, s.rank, t.rb);
    }
  }
  // The tile's row block and column block: its GEMM's tile coordinates.
  KOSMOS_MOE_INLINE void coord(const MoeTile& t, int* m, int* n) const { *m = t.rb, *n = t.n; }
  // The tile's work, for moe_build_serial: `Ops` supplies gemm1(t) / gemm2(t).
  KOSMOS_MOE_INLINE void run(const MoeTile& t) {
    if (t.gemm == 1) ops.gemm1(t); else ops.gemm2(t);
  }
};

// Up to `most` tiles of a build queue (MoeBuilds, or the backward's
// MoeBwdBuilds: moe/bwd_queues.h) one at a time (< 0: until it is empty);
// returns how many ran.
template <class Builds>
KOSMOS_MOE_INLINE int moe_build_serial(Builds b, int most) {
  int n = 0;
  for (MoeTile t; (most < 0 || n < most) && b.next(&t); ++n) {
    b.start(t);
    b.run(t);
    b.done(t);
  }
  return n;
}

template <class Ops>
KOSMOS_MOE_INLINE bool moe_unit_ready(Ops& ops, const MoeFwdShape& s, const MoeLayout& L, const MoeUnit& c) {
  int row;
  const int rows = moe_unit_rows(s, L, c, &row);
  for (int rb = row / s.tile_m; rows > 0 && rb <= (row + rows - 1) / s.tile_m; ++rb)
    if (!ops.test(MoeFlag::kGemm2, rb)) return false;
  return true;
}

// Pushes unit c once its row blocks are done (waits return at once after a
// successful moe_unit_ready). A unit without rows writes and releases nothing.
template <class Ops>
KOSMOS_MOE_INLINE void moe_push_unit(Ops& ops, const MoeFwdShape& s, const MoeLayout& L, const MoeUnit& c) {
  int row;
  const int rows = moe_unit_rows(s, L, c, &row);
  if (rows == 0) return;
  for (int rb = row / s.tile_m; rb <= (row + rows - 1) / s.tile_m; ++rb) ops.wait(MoeFlag::kGemm2, rb);
  if (c.dst != s.rank) ops.push_unit(c);
  ops.release(MoeFlag::kReturned, c.dst, s.rank * s.e_local + c.x);
}

// After the front (and a mover's dispatch): the GEMM tiles, and a mover's
// combine units between them. A builder builds until the build queue is
// empty. A mover is two-way: it holds one claimed unit at a time, pushes it
// once ready, else builds one tile; its units done, it builds whatever is
// left. switching = false, a fixed crew (the benchmarks' comparison, paper
// Table 2): movers never build, they wait for each unit. ops.build(L, most)
// runs up to `most` tiles of MoeBuilds (< 0: until the queue is empty) and
// returns how many; it has this one call site, so a Hopper kernel holds each
// GEMM's tile engine once.
template <class Ops>
KOSMOS_MOE_INLINE void moe_build_phase(Ops& ops, const MoeFwdShape& s, const MoeLayout& L, bool mover,
                                       bool switching) {
  const int n_units = moe_n_units(s);
  bool tiles = switching || !mover;
  // At EP = 1 every unit is our own and copies nothing, so holding one would
  // only cut a mover's building into one-tile passes (each fills and drains
  // the engine's pipeline): a mover builds as a builder does.
  int u = mover && (s.ep > 1 || !switching) ? ops.claim(MoeQueue::kCombine) : n_units;
  for (;;) {
    if (u < n_units) {
      const MoeUnit c = moe_unit_item(s, u);
      if (moe_two_way_step(moe_unit_ready(ops, s, L, c), tiles) != MoeStep::kBuild) {
        moe_push_unit(ops, s, L, c);
        u = ops.claim(MoeQueue::kCombine);
        continue;
      }
    } else if (!tiles) {
      return;
    }
    const int most = u < n_units ? 1 : -1;  // one tile while a unit is held, else the rest
    const int ran = ops.build(L, most);
    if (most < 0 || ran < most) tiles = false;
  }
}

template <class Ops>
KOSMOS_MOE_INLINE void moe_combine_rest(Ops& ops, const MoeFwdShape& s, const MoeLayout& L) {
  const int n = moe_n_units(s);
  for (int u = ops.claim(MoeQueue::kCombine); u < n; u = ops.claim(MoeQueue::kCombine))
    moe_push_unit(ops, s, L, moe_unit_item(s, u));
}

// Whether fold block b reads rows of expert e (and so waits for them).
KOSMOS_HD inline bool moe_fold_reads(const MoeFwdShape& s, const int* ends, int b, int e) {
  return moe_rows_before(s, ends, b + 1, e) > moe_rows_before(s, ends, b, e);
}

template <class Ops>
KOSMOS_MOE_INLINE void moe_fold_all(Ops& ops, const MoeFwdShape& s) {
  const int n = moe_n_fold(s), E = moe_experts(s);
  const int* ends = ops.ends();
  for (int f = ops.claim(MoeQueue::kFold); f < n; f = ops.claim(MoeQueue::kFold)) {
    int first, last;
    const int b = moe_fold_item(s, f, &first, &last);
    ops.wait_each(MoeFlag::kReturned, E, [&](int e) { return moe_fold_reads(s, ends, b, e); });
    if (s.shared_blocks > 0)
      for (int rb = first / s.tile_m; rb <= (last - 1) / s.tile_m; ++rb) ops.wait(MoeFlag::kGemm2, s.shared_rb0 + rb);
    ops.fold(f, first, last);
  }
}

// One CTA's life. Preconditions (the launcher): every CTA of the grid is
// resident; all ranks run the same shape (rank aside) and the same epoch;
// without switching, at least one CTA is a builder.
//
// Deadlock freedom. Each wait, and why the work it waits on is claimed by a
// running CTA that finishes it without waiting on the waiter:
//  kReady[d]: stored by d's CTA 0 before it waits on anything.
//  front: route blocks wait on nothing, so on every rank the last one finishes
//    and scans (then waits only on kReady to send its counts); scatters wait on that scan, claimed
//    earlier in the front queue; the layout item on every rank's scanner.
//    kPlanned / kLaidOut after the front queue is empty: every front item is
//    claimed by then.
//  kArrived (kXArrived, the backward's X rows): dispatch parts wait on nothing
//    (front work is done), and every rank has a mover that drains its move
//    queue, so every part is pushed.
//  kGemm1: GEMM1 tiles precede every GEMM2 tile in the build queue, so they are
//    claimed, and they wait only on kArrived (the shared expert's on nothing).
//  kGemm2 (a unit): a two-way mover builds instead of waiting while tiles are
//    left, and a builder pushes only once the build queue is empty: either way
//    every tile the unit needs is claimed, and tiles never wait on units.
//  kReturned (the fold): every CTA of every rank drains its combine queue
//    before folding, and units wait only on tiles.
//  kGemm2 (the fold, the shared expert's row blocks): claimed once the build
//    queue is empty, which a builder (there is one without switching) sees
//    before it folds, and tiles never wait on the fold.
// The waits form a DAG over (ready, front, dispatch, GEMM1, GEMM2, combine,
// fold), so every wait ends, down to one CTA per rank: it routes, plans and
// sends its counts (waiting only on the peers' CTA 0 announcements), dispatches
// every part, then alternates units and tiles, and folds last.
template <class Ops>
KOSMOS_MOE_INLINE void moe_fwd_cta(Ops& ops, const MoeFwdShape& s, int cta, int grid, int movers, bool switching = true) {
  if (cta == 0) ops.announce_ready();
  moe_front(ops, s);
  const MoeLayout& L = ops.local_layout();
  const bool mover = moe_initial_role(cta, grid, movers) == Role::kMover;
  if (mover) moe_dispatch(ops, s);
  moe_build_phase(ops, s, L, mover, switching);
  moe_combine_rest(ops, s, L);
  moe_fold_all(ops, s);
  ops.finish(grid);
}

}  // namespace kosmos::moe
