// CPU emulation of the bulk RS || NT scheduler: kernels/tp/bulk_rs_sched.h,
// rs_layout.h, queue.h, sync.h and roles.h compiled for the host and driven by
// N ranks, each launching a grid of G "CTAs" on W resident threads (G > W: a CTA
// starts only when a slot frees, in a random order), with random delays and
// several epochs back to back per rank (ranks drift apart), fresh partials every
// epoch. Checks: every push, GEMM tile and reduced element exactly once per
// epoch, the GEMM order covering every tile of dw; the output equal to the
// fixed-rank-order fp32 sum rounded once to bf16, bitwise, and identical across
// runs with other interleavings; pushes only into staging its owner announced
// free and never read stale or overwritten while read (tags checked before and
// after each read); every CTA announces before it waits, and reduces only once
// its rank's push queue is exhausted; nothing hangs (bounded waits abort).
// Direct sources (BulkRsShape::direct: every rank, or ranks switching from
// epoch to epoch): their partials are read straight from their dx_partial,
// which the "host" fills before each launch and poisons as soon as it ends
// (XLA reusing the buffer), so a source that ends before its readers shows.
// Usage: bulk_rs_sched_emu  (exit 0 = all passed; EMU_TIMEOUT_MS overrides the bound)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "kosmos/queue.h"
#include "kosmos/sync.h"
#include "tp/bulk_rs_sched.h"
#include "tp/rs_layout.h"

#include "emu_check.h"

using namespace kosmos;

namespace {

uint64_t g_timeout_ns = 10ull * 1000 * 1000 * 1000;
long g_order_sensitive = 0;  // elements whose sum changes with rank order

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Rank src's dx partial for element i of chunk c in epoch e: signs and
// exponents vary (2^-8..2^8), so the sum depends on the order of its terms.
float partial(unsigned seed, uint64_t e, int src, int c, int i) {
  uint64_t h = mix64(seed);
  for (uint64_t v : {e, (uint64_t)src, (uint64_t)c, (uint64_t)i}) h = mix64(h ^ v);
  const float v = std::ldexp(1.0f + (float)(h & 0xFFFFFF) / 16777216.0f, (int)((h >> 24) % 17) - 8);
  return (h >> 41) & 1 ? -v : v;
}

uint32_t fbits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float ffrom(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
uint16_t bf16_rne(float f) {  // the kernel's single rounding
  const uint32_t u = fbits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
uint64_t stage_tag(uint64_t e, int src, int band) { return (e << 40) | ((uint64_t)src << 32) | (uint64_t)band; }

struct Case {
  int tp, W, grid, movers;
  int rows, cols, band_rows, slices, tiles_m, tiles_n, group;
  int epochs, max_delay_us;
  bool switching = true;
  int direct = 0;  // 0: every rank pushes; 1: every rank is a direct source; 2: ranks of odd rank + epoch
  bool direct_at(int rank, uint64_t e) const { return tp > 1 && (direct == 1 || (direct == 2 && (rank + e) % 2)); }
};

// One rank's device memory: the real control block plus payload buffers.
struct Rank {
  std::unique_ptr<RsCtrl> ctrl{new RsCtrl()};  // zeroed once, like the heap
  uint32_t launched = 0;                       // block dispatch counter of the emulated launch
  std::vector<uint32_t> stage;                 // [(tp - 1) slots][rows * cols] fp32 bits
  std::vector<uint64_t> tag;                   // [slot][band] who pushed it, when
  std::vector<uint16_t> out;                   // [rows * cols] bf16 of our chunk
  std::vector<uint32_t> sum32;                 // the fp32 sums before rounding
  std::vector<uint32_t> pushed, built, reduced;  // exactly-once counters
  std::vector<uint32_t> dxp;                     // [tp chunks][rows * cols] this launch's partials, fp32 bits
  Rank(const Case& c, int bands)
      : stage((size_t)(c.tp - 1) * c.rows * c.cols), tag((size_t)(c.tp - 1) * bands), out((size_t)c.rows * c.cols),
        sum32((size_t)c.rows * c.cols), pushed((size_t)bands * c.tp), built((size_t)c.tiles_m * c.tiles_n),
        reduced((size_t)c.rows * c.cols), dxp((size_t)c.tp * c.rows * c.cols) {}
};
using Ranks = std::vector<std::unique_ptr<Rank>>;

struct HostOps {
  const Case& c;
  Ranks& ranks;
  int rank, cta;
  uint64_t e;
  unsigned data_seed;
  std::mt19937 rng;
  BulkRsShape s;
  bool announced = false;

  Rank& me() { return *ranks[rank]; }
  RsCtrl& ctl(int r) { return *ranks[r]->ctrl; }
  // Rank e % tp runs 4x slower in epoch e, so the others run an epoch ahead of
  // it and push into its staging while it may still read the last epoch's.
  void jitter() {
    const int max_us = c.max_delay_us * (rank == (int)(e % s.tp) ? 4 : 1);
    if (max_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % (max_us + 1)));
  }
  WaitSite site(const char* flag, int idx) { return {"bulk_rs_emu", rank, cta, flag, idx}; }
  int claim(uint32_t* next) { jitter(); return (int)WorkQueue{next, 0}.claim(); }

  int claim_push() { return claim(&ctl(rank).move_next); }
  int claim_reduce() {
    EMU_CHECK(ld_relaxed_u32(&ctl(rank).move_next) >= (uint32_t)bulk_n_push(s),
              "rank %d cta %d reduces before its rank's pushes are all claimed", rank, cta);
    return claim(&ctl(rank).reduce_next);
  }
  // The kernel's heap_use_guard, here always after this op's previous epoch:
  // every peer has finished it (done[p] >= e - 1, released by its last CTA).
  // Alone, this op needs only one of the guard and the ready[] wait in push():
  // a CTA announces before it pushes, so the guard also holds a fast peer's
  // pushes back until we finished the last epoch (dropping either check keeps
  // this emulation green, dropping both fails it). The guard is for other ops'
  // readers of the region (an AG pull), ready[] for this op's own epochs.
  void announce_ready() {
    for (int p = 0; p < s.tp; ++p)
      if (p != rank) wait_ge<Scope::kSys>(&ctl(rank).done[p], e - 1, g_timeout_ns, site("done", p));
    jitter();
    // Where our partials are this epoch (the same from every CTA).
    __atomic_store_n(&ctl(rank).src_ptr, (uint64_t)s.direct, __ATOMIC_RELAXED);
    store_release<Scope::kSys>(&ctl(rank).src_epoch, e);
    for (int p = 0; p < s.tp; ++p)
      if (p != rank) store_release<Scope::kSys>(&ctl(p).ready[rank], e);
    announced = true;
  }
  // Band m.band of chunk m.dst into dst's staging slot for us, once dst said it
  // is free; the tag is cleared first and set last, so a reader that sees the
  // right tag before and after its read read this epoch's data.
  void push(const BulkPush& m, int i) {
    EMU_CHECK(announced && m.dst != rank, "rank %d cta %d push %d: announced=%d dst=%d", rank, cta, i, announced,
              m.dst);
    __atomic_fetch_add(&me().pushed[m.band * s.tp + m.dst], 1u, __ATOMIC_RELAXED);
    wait_ge<Scope::kSys>(&ctl(rank).ready[m.dst], e, g_timeout_ns, site("peer_ready", m.dst));
    Rank& home = *ranks[m.dst];
    const int pos = bulk_stage_pos(rank, m.dst), bands = bulk_bands(s);
    __atomic_store_n(&home.tag[(size_t)pos * bands + m.band], 0ull, __ATOMIC_RELAXED);
    jitter();
    const size_t e0 = (size_t)bulk_band_row0(s, m.band) * s.cols, n = (size_t)bulk_band_len(s, m.band) * s.cols;
    uint32_t* slot = home.stage.data() + (size_t)pos * s.rows * s.cols;
    for (size_t i2 = e0; i2 < e0 + n; ++i2)
      __atomic_store_n(&slot[i2], fbits(partial(data_seed, e, rank, m.dst, (int)i2)), __ATOMIC_RELAXED);
    __atomic_store_n(&home.tag[(size_t)pos * bands + m.band], stage_tag(e, rank, m.band), __ATOMIC_RELAXED);
    store_release<Scope::kSys>(&ctl(m.dst).pub[rs_flag_index(m.band, rank)], e);
  }
  // The engine's producer thread claims one tile ahead of the one it builds.
  void build_all() {
    const int n = bulk_n_gemm(s);
    for (int next = claim(&ctl(rank).build_next); next < n;) {
      const int j = next;
      next = claim(&ctl(rank).build_next);
      const gemm::TileCoord t = bulk_gemm_tile(s, j);
      __atomic_fetch_add(&me().built[(size_t)t.m * s.tiles_n + t.n], 1u, __ATOMIC_RELAXED);
      jitter();
    }
  }
  bool tags_ok(int b, const char* when, const std::vector<bool>& direct) {
    bool ok = true;
    for (int src = 0; src < s.tp; ++src) {
      if (src == rank || direct[src]) continue;
      const uint64_t tg = __atomic_load_n(&me().tag[(size_t)bulk_stage_pos(src, rank) * bulk_bands(s) + b],
                                          __ATOMIC_RELAXED);
      EMU_CHECK(tg == stage_tag(e, src, b), "rank %d epoch %llu: rank %d's band %d %s read: tag %llx", rank,
                (unsigned long long)e, src, b, when, (unsigned long long)tg);
      ok = ok && tg == stage_tag(e, src, b);
    }
    return ok;
  }
  // Every peer's band has landed here (pub[]), then the fixed-order sum of the
  // slice: our own term straight from our dx_partial, the peers' from staging.
  void reduce(const BulkSlice& sl) {
    EMU_CHECK(announced || s.tp == 1, "rank %d cta %d reduces before announcing", rank, cta);
    std::vector<bool> direct(s.tp, false);
    for (int src = 0; src < s.tp; ++src) {
      if (src == rank) continue;
      wait_ge<Scope::kSys>(&ctl(src).src_epoch, e, g_timeout_ns, site("peer_source", src));
      direct[src] = __atomic_load_n(&ctl(src).src_ptr, __ATOMIC_RELAXED) != 0;
      if (!direct[src])
        wait_ge<Scope::kSys>(&ctl(rank).pub[rs_flag_index(sl.band, src)], e, g_timeout_ns,
                             site("pub", src * kRsMaxBands + sl.band));
    }
    if (!tags_ok(sl.band, "before", direct)) return;
    jitter();
    const size_t base = (size_t)bulk_band_row0(s, sl.band) * s.cols;
    for (size_t i = base + sl.e0; i < base + sl.e1; ++i) {
      float acc = 0.f;
      for (int src = 0; src < s.tp; ++src) {
        const size_t chunk = (size_t)rank * s.rows * s.cols;  // our chunk in every rank's dx_partial
        const float v = src == rank ? partial(data_seed, e, rank, rank, (int)i)
                        : direct[src] ? ffrom(__atomic_load_n(&ranks[src]->dxp[chunk + i], __ATOMIC_RELAXED))
                                      : ffrom(__atomic_load_n(&me().stage[(size_t)bulk_stage_pos(src, rank) * s.rows *
                                                                              s.cols + i], __ATOMIC_RELAXED));
        acc = src == 0 ? v : acc + v;  // from rank 0's value, as rs_reduce_fixed
      }
      me().sum32[i] = fbits(acc);
      me().out[i] = bf16_rne(acc);
      __atomic_fetch_add(&me().reduced[i], 1u, __ATOMIC_RELAXED);
    }
    jitter();  // a peer that pushed its next epoch too early overwrites the band now
    tags_ok(sl.band, "after", direct);
  }
  void finish(int grid) {
    RsCtrl& m = ctl(rank);
    if (add_acq_rel_gpu_u32(&m.finished, 1) != (uint32_t)grid - 1) return;
    for (int p = 0; p < s.tp; ++p)
      if (p != rank) store_release<Scope::kSys>(&ctl(p).done[rank], e);
    // Direct: dx_partial outlives the launch only until it ends; the peers' reads first.
    if (s.direct)
      for (int p = 0; p < s.tp; ++p)
        if (p != rank) wait_ge<Scope::kSys>(&m.done[p], e, g_timeout_ns, site("done(partials read)", p));
    m.move_next = m.build_next = m.reduce_next = m.finished = 0;
    store_release<Scope::kGpu>(&m.epoch, e);
  }
};

BulkRsShape shape_of(const Case& c, int rank) {
  return {c.tp, rank, c.rows, c.cols, c.band_rows, c.slices, c.tiles_m, c.tiles_n, c.group, 0};
}

// Checks one epoch of one rank against the fixed-order reference; returns a digest.
uint64_t check_epoch(const Case& c, const BulkRsShape& s, Rank& r, uint64_t e, unsigned data_seed) {
  for (int b = 0; b < bulk_bands(s); ++b)
    for (int d = 0; d < s.tp; ++d)
      EMU_CHECK(r.pushed[b * s.tp + d] == (d == s.rank || s.direct ? 0u : 1u), "tp=%d G=%d rank %d epoch %llu: band %d to %d "
                "pushed %u times", c.tp, c.grid, s.rank, (unsigned long long)e, b, d, r.pushed[b * s.tp + d]);
  for (size_t j = 0; j < r.built.size(); ++j)
    EMU_CHECK(r.built[j] == 1, "tp=%d G=%d rank %d epoch %llu: tile %zu built %u times", c.tp, c.grid, s.rank,
              (unsigned long long)e, j, r.built[j]);
  uint64_t digest = 1469598103934665603ull;
  for (int i = 0; i < s.rows * s.cols; ++i) {
    EMU_CHECK(r.reduced[i] == 1, "tp=%d G=%d rank %d epoch %llu: element %d reduced %u times", c.tp, c.grid,
              s.rank, (unsigned long long)e, i, r.reduced[i]);
    float acc = partial(data_seed, e, 0, s.rank, i), rev = partial(data_seed, e, s.tp - 1, s.rank, i);
    for (int src = 1; src < s.tp; ++src) acc += partial(data_seed, e, src, s.rank, i);
    for (int src = s.tp - 2; src >= 0; --src) rev += partial(data_seed, e, src, s.rank, i);
    if (fbits(acc) != fbits(rev)) __atomic_fetch_add(&g_order_sensitive, 1, __ATOMIC_RELAXED);
    EMU_CHECK(r.sum32[i] == fbits(acc) && r.out[i] == bf16_rne(acc),
              "tp=%d rank %d epoch %llu elem %d: got %08x/%04x want %08x/%04x", c.tp, s.rank, (unsigned long long)e,
              i, r.sum32[i], r.out[i], fbits(acc), bf16_rne(acc));
    digest = ((digest ^ r.sum32[i]) * 1099511628211ull ^ r.out[i]) * 1099511628211ull;
  }
  return digest;
}

// One rank's launches, back to back. Each launch: G CTAs on W resident threads;
// a thread takes the next CTA from a random start order only when it is free.
void run_rank(const Case& c, Ranks& ranks, int rank, unsigned jitter_seed, unsigned data_seed,
              std::vector<uint64_t>& digests) {
  std::mt19937 rng(jitter_seed * 2654435761u + (unsigned)rank);
  Rank& r = *ranks[rank];
  for (int it = 0; it < c.epochs; ++it) {
    const uint64_t e = load_acquire<Scope::kGpu>(&r.ctrl->epoch) + 1;
    BulkRsShape s = shape_of(c, rank);
    s.direct = c.direct_at(rank, e);
    for (int ch = 0; ch < c.tp; ++ch)  // this launch's input
      for (int i = 0; i < c.rows * c.cols; ++i)
        __atomic_store_n(&r.dxp[(size_t)ch * c.rows * c.cols + i], fbits(partial(data_seed, e, rank, ch, i)),
                         __ATOMIC_RELAXED);
    for (auto* v : {&r.pushed, &r.built, &r.reduced}) std::fill(v->begin(), v->end(), 0u);
    std::fill(r.out.begin(), r.out.end(), (uint16_t)0xFFFF);  // poison: NaN
    std::fill(r.sum32.begin(), r.sum32.end(), 0xFFFFFFFFu);
    std::vector<int> order(c.grid);
    for (int i = 0; i < c.grid; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    r.launched = 0;
    std::vector<std::thread> slots;
    for (int w = 0; w < c.W; ++w)
      slots.emplace_back([&, w] {
        for (uint32_t k = __atomic_fetch_add(&r.launched, 1u, __ATOMIC_RELAXED); k < (uint32_t)c.grid;
             k = __atomic_fetch_add(&r.launched, 1u, __ATOMIC_RELAXED)) {
          const int cta = order[k];
          const unsigned cta_seed = jitter_seed * 7919u + (unsigned)e * 131u + 977u * (unsigned)w + (unsigned)cta;
          HostOps ops{c, ranks, rank, cta, e, data_seed, std::mt19937(cta_seed * 31u + (unsigned)rank), s};
          bulk_rs_cta(ops, s, cta, c.grid, c.movers, c.switching);
        }
      });
    for (auto& t : slots) t.join();
    for (auto& v : r.dxp) __atomic_store_n(&v, 0x7FC00000u, __ATOMIC_RELAXED);  // XLA reuses it: NaN
    digests.push_back(check_epoch(c, s, r, e, data_seed));
  }
}

std::vector<uint64_t> run_case(const Case& c, unsigned jitter_seed, unsigned data_seed) {
  const int bands = bulk_bands(shape_of(c, 0));
  Ranks ranks;
  for (int r = 0; r < c.tp; ++r) ranks.emplace_back(new Rank(c, bands));
  std::vector<std::vector<uint64_t>> digests(c.tp);
  std::vector<std::thread> drivers;
  for (int r = 0; r < c.tp; ++r)
    drivers.emplace_back(run_rank, std::cref(c), std::ref(ranks), r, jitter_seed, data_seed, std::ref(digests[r]));
  for (auto& d : drivers) d.join();
  std::vector<uint64_t> all;
  for (int r = 0; r < c.tp; ++r) {
    const RsCtrl& m = *ranks[r]->ctrl;
    EMU_CHECK(m.epoch == (uint64_t)c.epochs && m.move_next == 0 && m.build_next == 0 && m.reduce_next == 0,
              "rank %d ended at epoch %llu with queues %u/%u/%u", r, (unsigned long long)m.epoch, m.move_next,
              m.build_next, m.reduce_next);
    all.insert(all.end(), digests[r].begin(), digests[r].end());
  }
  return all;
}

// The GEMM order is a bijection onto the tiles of dw.
void check_gemm_order(const Case& c) {
  const BulkRsShape s = shape_of(c, 0);
  std::set<std::pair<int, int>> seen;
  for (int j = 0; j < bulk_n_gemm(s); ++j) {
    const gemm::TileCoord t = bulk_gemm_tile(s, j);
    EMU_CHECK(t.m >= 0 && t.m < s.tiles_m && t.n >= 0 && t.n < s.tiles_n && seen.insert({t.m, t.n}).second,
              "GEMM item %d -> tile (%d, %d) outside %dx%d or repeated", j, t.m, t.n, s.tiles_m, s.tiles_n);
  }
}

std::vector<Case> make_cases() {
  struct Dims { int rows, cols, band_rows, slices, tiles_m, tiles_n, group; };
  // One band; short last band and slices finer than it (some empty); many
  // bands; no GEMM tiles at all.
  const Dims dims[] = {{8, 3, 8, 1, 3, 2, 2}, {21, 5, 8, 4, 2, 3, 1}, {40, 8, 8, 2, 4, 3, 2}, {13, 4, 16, 3, 0, 0, 1}};
  std::vector<Case> cases;
  int n = 0;
  for (int tp : {1, 2, 3, 4})
    for (int W : {1, 2, 4})
      for (int extra : {0, 2})  // grid = W (all resident) or W + 2 (two wait for a slot)
        for (int mv : {0, 1, 99}) {
          const Dims d = dims[n++ % 4];
          const int G = W + extra;
          cases.push_back({tp, W, G, std::min(mv, G), d.rows, d.cols, d.band_rows, d.slices, d.tiles_m, d.tiles_n,
                           d.group, 3, 20});
        }
  // One CTA per rank, every role in turn; wide groups; no delays (tight interleavings).
  for (int tp : {2, 3, 8})
    for (int mv : {0, 1}) cases.push_back({tp, 1, 1, mv, 21, 5, 8, 4, 2, 3, 1, 4, tp == 8 ? 5 : 20});
  cases.push_back({8, 2, 5, 2, 40, 8, 8, 2, 4, 3, 2, 3, 5});
  cases.push_back({8, 4, 4, 4, 24, 3, 8, 3, 2, 2, 1, 3, 5});
  cases.push_back({2, 1, 1, 1, 40, 8, 8, 2, 4, 3, 2, 8, 0});
  cases.push_back({3, 2, 2, 0, 40, 8, 8, 5, 4, 3, 2, 8, 0});
  // Fixed splits (switching off): 1 <= movers <= grid - 1, residency full or partial.
  for (int tp : {1, 2, 3, 4})
    for (int mv : {1, 2}) {
      const Dims d = dims[n++ % 4];
      cases.push_back({tp, 3, 3, mv, d.rows, d.cols, d.band_rows, d.slices, d.tiles_m, d.tiles_n, d.group, 3, 20,
                       false});
    }
  cases.push_back({3, 2, 4, 1, 21, 5, 8, 4, 2, 3, 1, 3, 20, false});  // 2 resident of 4
  cases.push_back({2, 1, 2, 1, 40, 8, 8, 2, 4, 3, 2, 4, 10, false});  // 1 resident of 2: builder or mover first
  cases.push_back({8, 2, 3, 1, 13, 4, 16, 3, 0, 0, 1, 3, 5, false});
  // Direct sources: every rank, and ranks switching between direct and pushing
  // from epoch to epoch; one CTA, partial residency, fixed splits, 8 ranks.
  for (int direct : {1, 2}) {
    for (int tp : {2, 3, 4})
      for (int W : {1, 2})
        for (int mv : {0, 1}) {
          Case c{tp, W, W + 1, mv, 21, 5, 8, 4, 2, 3, 1, 5, 20};
          c.direct = direct;
          cases.push_back(c);
        }
    Case fixed{3, 2, 4, 1, 40, 8, 8, 2, 4, 3, 2, 4, 20, false}, wide{8, 2, 5, 2, 40, 8, 8, 2, 4, 3, 2, 4, 5},
        tight{2, 1, 1, 1, 40, 8, 8, 2, 4, 3, 2, 8, 0};
    for (Case* c : {&fixed, &wide, &tight}) {
      c->direct = direct;
      cases.push_back(*c);
    }
  }
  return cases;
}

}  // namespace

int main() {
  if (const char* ms = std::getenv("EMU_TIMEOUT_MS")) g_timeout_ns = std::strtoull(ms, nullptr, 10) * 1000000ull;
  const std::vector<Case> cases = make_cases();
  unsigned seed = 1;
  for (const Case& c : cases) {
    // Named before it runs: a bounded wait that traps leaves this as the last line.
    std::printf("case tp=%d W=%d G=%d movers=%d switching=%d direct=%d rows=%d cols=%d band_rows=%d slices=%d "
                "tiles=%dx%d\n", c.tp, c.W, c.grid, c.movers, (int)c.switching, c.direct, c.rows, c.cols, c.band_rows,
                c.slices, c.tiles_m, c.tiles_n);
    std::fflush(stdout);
    check_gemm_order(c);
    const std::vector<uint64_t> a = run_case(c, seed, seed + 1000);
    // Same data, other interleaving: the outputs must be bitwise the same.
    if (c.tp >= 2 && c.W >= 2) {
      const std::vector<uint64_t> b = run_case(c, seed + 5000, seed + 1000);
      EMU_CHECK(a == b, "tp=%d W=%d G=%d: output differs between runs with the same data", c.tp, c.W, c.grid);
    }
    ++seed;
  }
  // The bitwise checks only have teeth if the order of the terms matters.
  EMU_CHECK(g_order_sensitive > 0, "no element's sum depends on rank order: the data cannot catch order bugs");
  std::printf("%zu cases, %ld order-sensitive sums, %d failures\n", cases.size(), g_order_sensitive,
              emu::g_failures);
  return emu::g_failures ? 1 : 0;
}
