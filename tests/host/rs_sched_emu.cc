// CPU emulation of the GEMM+RS scheduler: kernels/tp/rs_sched.h (the one CTA
// life, rs_cta), rs_layout.h, queue.h, sync.h and roles.h compiled for the host
// and driven by N ranks, each launching a grid of W "CTAs", one thread each
// (every CTA resident, as the launchers guarantee: a reducer waits for claims
// only builders make), with random delays and several epochs back to back per
// rank (ranks drift apart), fresh partials every epoch. The builders emulate
// either engine's timing around the shared scheduler (RsSched): the portable
// engine claims a tile, builds it and counts it at once; the Hopper engine
// claims one tile ahead and counts each tile one tile late.
// Checks: every GEMM tile built and every output tile reduced exactly once per
// epoch; the output equals the fixed-rank-order fp32 sum rounded once to bf16,
// bitwise, and is identical across runs with other interleavings; every wait is
// on claimed work; reducers never build; staging is never read stale or
// overwritten while a peer reads it (tag checked before and after each read);
// nothing hangs (bounded waits trap), down to one CTA per rank.
// Every transport type, each epoch's rs_cta instantiated for its own: Pull;
// Push, where builders write into the chunk owner's staging; PushFold (own
// chunk summed in its builders' epilogues, no reducers); epochs alternating
// between push and pull, and push bitwise equal to pull.
// Usage: rs_sched_emu  (exit 0 = all passed; EMU_TIMEOUT_MS overrides the bound)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "kosmos/pull.h"
#include "kosmos/push.h"
#include "kosmos/queue.h"
#include "kosmos/sync.h"
#include "tp/rs_layout.h"
#include "tp/rs_sched.h"

#include "emu_check.h"

using namespace kosmos;

namespace {

constexpr int kElems = 6;  // fp32 elements per emulated tile
uint64_t g_timeout_ns = 10ull * 1000 * 1000 * 1000;
long g_order_sensitive = 0;  // elements whose sum changes with rank order
long g_claim_waits = 0;      // reducers that found their step not yet claimed (the claim wait at work)

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Rank src's partial for element i of tile (t, tn) of chunk c in epoch e: signs
// and exponents vary (2^-8..2^8) so the sum depends on the order of its terms.
float partial(unsigned seed, uint64_t e, int src, int c, int t, int tn, int i) {
  uint64_t h = mix64(seed);
  for (uint64_t v : {e, (uint64_t)src, (uint64_t)c, (uint64_t)t, (uint64_t)tn, (uint64_t)i}) h = mix64(h ^ v);
  const float m = 1.0f + (float)(h & 0xFFFFFF) / 16777216.0f;
  const float v = std::ldexp(m, (int)((h >> 24) % 17) - 8);
  return (h >> 41) & 1 ? -v : v;
}

uint32_t fbits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float ffrom(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
// fp32 -> bf16, round to nearest even: the kernel's single rounding.
uint16_t bf16_rne(float f) {
  const uint32_t u = fbits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
uint64_t stage_tag(uint64_t e, int src, int slot) { return (e << 40) | ((uint64_t)src << 32) | (uint64_t)slot; }

struct Case {
  int tp, W, reducers, T, NT, R, slice, epochs, max_delay_us;  // W: the grid, one thread per CTA
  bool hopper = false;          // the Hopper engine's timing (claim ahead, count late); else the portable one's
  bool switching = true;        // false: builders stop when the GEMM queue is empty (fixed split)
  int push = 0;                 // 1: Push (Hopper builders only), 0: Pull; 2: alternate, pull on odd epochs
  bool fold = false;            // push epochs fold (PushFold; reducers must be 0)
  int lag = 0;                  // fold: RsShape::lag
};

// One rank's device memory: the real control block plus payload buffers.
struct Rank {
  std::unique_ptr<RsCtrl> ctrl{new RsCtrl()};  // zeroed once, like the heap
  std::vector<uint32_t> stage;                 // [slot][kElems] fp32 bits
  std::vector<uint64_t> tag;                   // [slot] who wrote it, when
  std::vector<uint16_t> out;                   // [tile][kElems] bf16 of our chunk
  std::vector<uint32_t> sum32;                 // [tile][kElems] the fp32 sums before rounding
  std::vector<uint32_t> built, reduced;        // exactly-once counters
  explicit Rank(const RsShape& s)
      : stage(rs_n_build(s) * kElems), tag(rs_n_build(s)), out(s.T * s.NT * kElems),
        sum32(s.T * s.NT * kElems), built(rs_n_build(s)), reduced(s.T * s.NT) {}
};
using Ranks = std::vector<std::unique_ptr<Rank>>;

// Tr: the epoch's transport, rs_cta's.
template <class Tr>
struct HostOps {
  const Case& c;
  Ranks& ranks;
  int rank, cta;
  uint64_t e;
  unsigned data_seed;
  std::mt19937 rng;
  RsShape s;
  bool prev_pull;  // the previous epoch pulled: its remote readers of our staging must be done
  bool reducing = false;

  Rank& me() { return *ranks[rank]; }
  RsCtrl& ctl(int r) { return *ranks[r]->ctrl; }
  void jitter() {
    if (c.max_delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % (c.max_delay_us + 1)));
  }
  WaitSite site(const char* flag, int idx) { return {"rs_emu", rank, cta, flag, idx}; }
  WorkQueue build_q() { return WorkQueue{&ctl(rank).build_next, 0}; }

  bool build_claimed(int j) { return build_q().claimed((uint32_t)j); }
  int claim_reduce() { jitter(); reducing = true; return (int)WorkQueue{&ctl(rank).reduce_next, 0}.claim(); }
  // RsSched::next: claims GEMM tile j, marking its step claimed if j is the
  // step's last tile (the claim, not the build: peers may now wait on the step).
  int claim_build() {
    jitter();
    const int j = (int)build_q().claim();
    if (j < rs_n_build(s) && !Tr::kFold && j + 1 == rs_step_end(s, rs_build_item<Tr>(s, j).band))
      store_release<Scope::kSys>(&ctl(rank).step_claimed[rs_build_item<Tr>(s, j).band], e);
    return j;
  }
  // Reuse rule, the least the protocol needs: only a pull epoch has remote
  // readers of our staging. (The kernel's heap_use_guard waits in either case.)
  // After a push epoch nothing but ready[] holds back a fast peer's pushes, so
  // the emulation checks that handshake on its own.
  void wait_peer_done(int p) {
    if (prev_pull) wait_ge<Scope::kSys>(&ctl(rank).done[p], e - 1, g_timeout_ns, site("done", p));
  }
  void announce_ready() {
    EMU_CHECK(Tr::kPush && c.hopper, "rank %d cta %d announces without the push transport", rank, cta);
    for (int p = 0; p < s.tp; ++p)
      if (p != rank) wait_peer_done(p);
    jitter();
    for (int p = 0; p < s.tp; ++p)
      if (p != rank) store_release<Scope::kSys>(&ctl(p).ready[rank], e);
  }

  // The "GEMM": this rank's partial of tile t. The tag is cleared first and set
  // last, so a reader that sees the right tag before and after read this epoch's data.
  // Both engines take a band column by column (RsSched) and stage by
  // coordinates (the hooks' slot_of / tile_of).
  // Push: written into the chunk owner's staging (rs_staged), once the owner
  // announced it free (the kernel's RsSm90Hooks::before_tile).
  void build(const RsTile& t) {
    EMU_CHECK(!reducing, "rank %d cta %d builds after it reduced", rank, cta);
    const RsBandTile bt = rs_band_tile_colmajor(s, t.band, t.k);
    const int k = rs_band_index(s, bt.row, bt.col);
    const RsStaged h = rs_staged<Tr>(rank, t.chunk);
    const int slot = rs_stage_slot(s, t.band, h.pos, k);
    __atomic_fetch_add(&me().built[rs_stage_slot(s, t.band, t.chunk, k)], 1u, __ATOMIC_RELAXED);
    if (rs_folds<Tr>(s, t.chunk)) return;  // summed in its epilogue (fold), never staged
    if (h.home != rank) wait_ge<Scope::kSys>(&ctl(rank).ready[h.home], e, g_timeout_ns, site("ready", h.home));
    Rank& home = *ranks[h.home];
    __atomic_store_n(&home.tag[slot], 0ull, __ATOMIC_RELAXED);
    jitter();
    const int row = t.band * s.R + bt.row, tn = bt.col;
    for (int i = 0; i < kElems; ++i)
      __atomic_store_n(&home.stage[slot * kElems + i], fbits(partial(data_seed, e, rank, t.chunk, row, tn, i)),
                       __ATOMIC_RELAXED);
    __atomic_store_n(&home.tag[slot], stage_tag(e, rank, slot), __ATOMIC_RELAXED);
  }
  // The hooks' tile_done: counts a staged tile into its band; the band's last
  // tile publishes it (at its home: ours under pull, the owner's under push).
  // Folded tiles are not staged: nothing to count.
  void tile_done(const RsTile& t) {
    if (rs_folds<Tr>(s, t.chunk)) return;
    if (add_acq_rel_gpu_u32(&ctl(rank).band_count[rs_flag_index(t.band, t.chunk)], 1) + 1 !=
        (uint32_t)rs_band_tiles(s, t.band))
      return;
    const RsStaged h = rs_staged<Tr>(rank, t.chunk);
    store_release<Scope::kSys>(&ctl(h.home).pub[rs_flag_index(t.band, h.pos)], e);
  }
  // The kernels' build_all: the staging guard once, then the engine over the
  // GEMM queue. Portable: claim, build, count. Hopper: the producer claims one
  // tile ahead, and the staged epilogue counts a tile into its band only after
  // the CTA's next tile is built, or when the engine returns (RsSm90Hooks::
  // tile_done); a folded tile is summed after that count, in its own epilogue.
  void build_all() {
    for (int p = 0; p < s.tp; ++p)
      if (p != rank) wait_peer_done(p);
    const int n = rs_n_build(s);
    if (!c.hopper) {
      for (int j = claim_build(); j < n; j = claim_build()) {
        const RsTile t = rs_build_item<Tr>(s, j);
        build(t);
        tile_done(t);
      }
      return;
    }
    RsTile done_due{};
    bool due = false;
    for (int next = claim_build(); next < n;) {
      const int j = next;
      next = claim_build();
      const RsTile t = rs_build_item<Tr>(s, j);
      build(t);
      if (due) tile_done(done_due);
      if (rs_folds<Tr>(s, t.chunk)) fold(t);
      done_due = t;
      due = true;
    }
    if (due) tile_done(done_due);
  }
  void wait_build_claimed(int j) {
    if (!build_claimed(j)) __atomic_fetch_add(&g_claim_waits, 1, __ATOMIC_RELAXED);
    const auto t0 = std::chrono::steady_clock::now();
    while (!build_claimed(j)) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::nanoseconds(g_timeout_ns)) {
        std::fprintf(stderr, "rank %d cta %d: build %d never claimed\n", rank, cta, j);
        std::abort();  // a deadlock, like a device wait's trap
      }
      std::this_thread::yield();
    }
  }

  // Waiting on a peer's step is allowed only once our own step b is claimed.
  void wait_step_claimed(int src, int b) {
    EMU_CHECK(build_claimed(rs_step_end(s, b) - 1), "rank %d cta %d waits on rank %d step %d before claiming its own",
              rank, cta, src, b);
    wait_ge<Scope::kSys>(&ctl(src).step_claimed[b], e, g_timeout_ns, site("step_claimed", b));
  }
  void wait_band(int src, int b) {
    const bool claimed = src == rank ? build_claimed(rs_step_end(s, b) - 1)
                                     : load_acquire<Scope::kSys>(&ctl(src).step_claimed[b]) >= e;
    EMU_CHECK(claimed, "rank %d cta %d waits on band %d of rank %d, not claimed there", rank, cta, b, src);
    const RsStaged h = rs_staged<Tr>(src, rank);
    wait_ge<Scope::kSys>(&ctl(h.home).pub[rs_flag_index(b, h.pos)], e, g_timeout_ns, site("pub", b));
  }
  // Rank src's partial of tile k of band b of our chunk: its rank and slot.
  std::pair<Rank*, int> staged(int src, int b, int k) {
    const RsStaged h = rs_staged<Tr>(src, rank);
    return {ranks[h.home].get(), rs_stage_slot(s, b, h.pos, k)};
  }
  bool tags_ok(int b, int k, const char* when) {
    bool ok = true;
    for (int src = 0; src < s.tp; ++src) {
      if (Tr::kFold && src == rank) continue;  // our own partial is never staged
      const auto [home, slot] = staged(src, b, k);
      const uint64_t tg = __atomic_load_n(&home->tag[slot], __ATOMIC_RELAXED);
      EMU_CHECK(tg == stage_tag(e, src, slot), "rank %d epoch %llu: rank %d's partial (slot %d) %s read: tag %llx",
                rank, (unsigned long long)e, src, slot, when, (unsigned long long)tg);
      ok = ok && tg == stage_tag(e, src, slot);
    }
    return ok;
  }
  // Output tile `tile` (band b, tile k of our chunk) as the fixed-order sum of
  // every rank's partial; own(i), when given, stands in for our partial (fold:
  // never staged). Tags are checked before and after the read.
  template <class Own>
  void sum_tile(int b, int k, int tile, const Own* own) {
    if (!tags_ok(b, k, "before")) return;
    jitter();
    auto src = [&](int r, uint32_t i) {
      if (own != nullptr && r == rank) return (*own)(i);
      const auto [home, slot] = staged(r, b, k);
      return ffrom(__atomic_load_n(&home->stage[slot * kElems + i], __ATOMIC_RELAXED));
    };
    auto dst = [&](uint32_t i, float sum) {
      me().sum32[tile * kElems + i] = fbits(sum);
      me().out[tile * kElems + i] = bf16_rne(sum);
    };
    rs_reduce_fixed(s.tp, kElems, 0, 1, src, dst);
    jitter();  // a peer that reused its staging too early overwrites it now
    tags_ok(b, k, "after");
    __atomic_fetch_add(&me().reduced[tile], 1u, __ATOMIC_RELAXED);
  }
  void reduce(const RsSlice& sl) {
    using NoOwn = float (*)(uint32_t);
    for (int k = sl.k0; k < sl.k0 + sl.n; ++k) sum_tile<NoOwn>(sl.band, k, sl.band * s.R * s.NT + k, nullptr);
  }
  // Fold: own tile t of our chunk once every peer has published its band here;
  // the sum in rank order with our partial in its place.
  void fold(const RsTile& t) {
    EMU_CHECK(reducing == false && t.chunk == rank, "rank %d cta %d folds a tile it does not own", rank, cta);
    for (int src = 0; src < s.tp; ++src)
      if (src != rank) wait_ge<Scope::kSys>(&ctl(rank).pub[rs_flag_index(t.band, src)], e, g_timeout_ns,
                                            site("pub(fold)", src));
    const RsBandTile bt = rs_band_tile_colmajor(s, t.band, t.k);
    const int k = rs_band_index(s, bt.row, bt.col), row = t.band * s.R + bt.row;
    auto own = [&](uint32_t i) { return partial(data_seed, e, rank, rank, row, bt.col, (int)i); };
    sum_tile(t.band, k, t.band * s.R * s.NT + k, &own);
  }
  void finish(int grid) {
    RsCtrl& m = ctl(rank);
    if (add_acq_rel_gpu_u32(&m.finished, 1) != (uint32_t)grid - 1) return;
    // Every CTA of this launch is done reading the peers' staging: tell them.
    for (int p = 0; p < s.tp; ++p)
      if (p != rank) store_release<Scope::kSys>(&ctl(p).done[rank], e);
    for (int b = 0; b < rs_bands(s); ++b)
      for (int ch = 0; ch < s.tp; ++ch) m.band_count[rs_flag_index(b, ch)] = 0;
    m.build_next = m.reduce_next = m.finished = 0;
    store_release<Scope::kGpu>(&m.epoch, e);
  }
};

// Checks one epoch's output against the fixed-order reference; returns a digest.
uint64_t check_epoch(const Case& c, const RsShape& s, Rank& r, uint64_t e, unsigned data_seed) {
  for (int j = 0; j < rs_n_build(s); ++j)
    EMU_CHECK(r.built[j] == 1, "tp=%d W=%d rank %d epoch %llu: staging slot %d built %u times", c.tp, c.W,
              s.rank, (unsigned long long)e, j, r.built[j]);
  uint64_t digest = 1469598103934665603ull;
  for (int tile = 0; tile < s.T * s.NT; ++tile) {
    EMU_CHECK(r.reduced[tile] == 1, "tp=%d W=%d rank %d epoch %llu: tile %d reduced %u times", c.tp, c.W,
              s.rank, (unsigned long long)e, tile, r.reduced[tile]);
    for (int i = 0; i < kElems; ++i) {
      const int t = tile / s.NT, tn = tile % s.NT;
      float acc = partial(data_seed, e, 0, s.rank, t, tn, i), rev = partial(data_seed, e, s.tp - 1, s.rank, t, tn, i);
      for (int src = 1; src < s.tp; ++src) acc += partial(data_seed, e, src, s.rank, t, tn, i);
      for (int src = s.tp - 2; src >= 0; --src) rev += partial(data_seed, e, src, s.rank, t, tn, i);
      if (fbits(acc) != fbits(rev)) __atomic_fetch_add(&g_order_sensitive, 1, __ATOMIC_RELAXED);
      const uint32_t got32 = r.sum32[tile * kElems + i];
      const uint16_t got = r.out[tile * kElems + i];
      EMU_CHECK(got32 == fbits(acc) && got == bf16_rne(acc),
                "tp=%d rank %d epoch %llu tile %d elem %d: got %08x/%04x want %08x/%04x", c.tp, s.rank,
                (unsigned long long)e, tile, i, got32, got, fbits(acc), bf16_rne(acc));
      digest = ((digest ^ got32) * 1099511628211ull ^ got) * 1099511628211ull;
    }
  }
  return digest;
}

// One launch of rank `rank` over transport Tr: W CTAs, one thread each,
// started in a random order; returns the output's digest.
template <class Tr>
uint64_t run_epoch(const Case& c, Ranks& ranks, int rank, unsigned jitter_seed, unsigned data_seed, std::mt19937& rng,
                   bool prev_pull) {
  Rank& r = *ranks[rank];
  const RsShape s{c.tp, rank, c.T, c.NT, c.R, c.slice, c.lag};
  const uint64_t e = load_acquire<Scope::kGpu>(&r.ctrl->epoch) + 1;
  std::fill(r.built.begin(), r.built.end(), 0u);
  std::fill(r.reduced.begin(), r.reduced.end(), 0u);
  std::fill(r.out.begin(), r.out.end(), (uint16_t)0xFFFF);  // poison: NaN
  std::fill(r.sum32.begin(), r.sum32.end(), 0xFFFFFFFFu);
  std::vector<int> order(c.W);
  for (int i = 0; i < c.W; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::thread> ctas;
  for (const int cta : order)
    ctas.emplace_back([&, cta] {
      const unsigned cta_seed = jitter_seed * 7919u + (unsigned)e * 131u + (unsigned)cta;
      HostOps<Tr> ops{c, ranks, rank, cta, e, data_seed, std::mt19937(cta_seed * 31u + (unsigned)rank), s, prev_pull};
      rs_cta<Tr>(ops, s, cta, c.W, c.reducers, c.switching);
    });
  for (auto& t : ctas) t.join();
  return check_epoch(c, s, r, e, data_seed);
}

// One rank's launches, back to back, each epoch over its transport.
void run_rank(const Case& c, Ranks& ranks, int rank, unsigned jitter_seed, unsigned data_seed,
              std::vector<uint64_t>& digests) {
  std::mt19937 rng(jitter_seed * 2654435761u + (unsigned)rank);
  auto push_at = [&](int it) { return c.push == 2 ? it % 2 == 0 : c.push != 0; };
  for (int it = 0; it < c.epochs; ++it) {
    const bool prev_pull = it > 0 && !push_at(it - 1);
    auto run = [&](auto tr) {
      return run_epoch<decltype(tr)>(c, ranks, rank, jitter_seed, data_seed, rng, prev_pull);
    };
    digests.push_back(!push_at(it) ? run(Pull{}) : c.fold && c.tp > 1 ? run(PushFold{}) : run(Push{}));
  }
}

// Runs every rank of a case; returns the per-(rank, epoch) output digests.
std::vector<uint64_t> run_case(const Case& c, unsigned jitter_seed, unsigned data_seed) {
  Ranks ranks;
  for (int r = 0; r < c.tp; ++r) ranks.emplace_back(new Rank(RsShape{c.tp, r, c.T, c.NT, c.R, c.slice}));
  std::vector<std::vector<uint64_t>> digests(c.tp);
  std::vector<std::thread> drivers;
  for (int r = 0; r < c.tp; ++r)
    drivers.emplace_back(run_rank, std::cref(c), std::ref(ranks), r, jitter_seed, data_seed, std::ref(digests[r]));
  for (auto& d : drivers) d.join();
  std::vector<uint64_t> all;
  for (int r = 0; r < c.tp; ++r) {
    EMU_CHECK(ranks[r]->ctrl->epoch == (uint64_t)c.epochs, "rank %d ended at epoch %llu", r,
              (unsigned long long)ranks[r]->ctrl->epoch);
    all.insert(all.end(), digests[r].begin(), digests[r].end());
  }
  return all;
}

std::vector<Case> make_cases() {
  struct Dims { int T, NT, R, slice; };
  // Shapes: one tile row per band; short last band with slices; one band per
  // chunk (whole chunk in step 0); slices larger than a band.
  const Dims dims[] = {{3, 2, 1, 1}, {5, 2, 2, 3}, {4, 3, 4, 2}, {4, 2, 3, 16}};
  std::vector<Case> cases;
  int n = 0;
  // Both engines' timing: grids of 1 (one CTA per rank builds, then reduces),
  // 2 and 4; no reducers, one, all (clamped: one CTA stays a builder).
  for (bool hopper : {false, true})
    for (int tp : {1, 2, 3, 4})
      for (int W : {1, 2, 4})
        for (int red : {0, 1, 99}) {
          const Dims d = dims[n++ % 4];
          cases.push_back({tp, W, red > W ? W : red, d.T, d.NT, d.R, d.slice, 3, 20, hopper});
        }
  for (bool hopper : {false, true}) {
    cases.push_back({8, 1, 0, 3, 2, 1, 2, 3, 5, hopper});   // wide group, one CTA per rank
    cases.push_back({8, 5, 5, 4, 2, 2, 1, 3, 5, hopper});   // wide group, all reducers but one
    cases.push_back({8, 4, 1, 5, 3, 2, 4, 3, 5, hopper});
    cases.push_back({2, 1, 0, 6, 4, 1, 3, 6, 0, hopper});   // one CTA, no delays: tight interleavings
    cases.push_back({3, 2, 1, 6, 4, 2, 5, 6, 0, hopper});
  }
  // Fixed splits (switching off): 1 <= reducers <= grid - 1.
  for (int tp : {2, 3})
    for (bool hopper : {false, true})
      for (int red : {1, 2}) {
        const Dims d = dims[n++ % 4];
        cases.push_back({tp, 3, red, d.T, d.NT, d.R, d.slice, 3, 20, hopper, false});
      }
  cases.push_back({2, 2, 1, 5, 2, 2, 3, 3, 20, false, false});  // fixed split of two CTAs
  // Push transport (Hopper builders), and epochs alternating with pull.
  for (int tp : {2, 3, 4})
    for (int W : {1, 3})
      for (int red : {0, 1, 99})
        for (int push : {1, 2}) {
          const Dims d = dims[n++ % 4];
          cases.push_back({tp, W, red > W ? W : red, d.T, d.NT, d.R, d.slice, 4, 20, true, true, push});
        }
  for (int push : {1, 2}) {
    cases.push_back({8, 4, 2, 5, 3, 1, 1, 4, 5, true, true, push});
    cases.push_back({3, 3, 1, 5, 2, 2, 3, 4, 20, true, false, push});  // fixed split
    cases.push_back({2, 1, 0, 6, 4, 1, 3, 8, 0, true, true, push});    // one CTA, no delays
  }
  // Fold (push epochs; alternating with pull for push == 2): every CTA builds;
  // own bands trailing by 0 (the same step), 1, 2 steps or all last (99).
  for (int tp : {2, 3, 4})
    for (int W : {1, 3})
      for (int push : {1, 2})
        for (int lag : {0, 1, 2, 99}) {
          const Dims d = dims[n++ % 4];
          cases.push_back({tp, W, 0, d.T, d.NT, d.R, d.slice, 4, 20, true, true, push, true, lag});
        }
  cases.push_back({8, 4, 0, 5, 3, 1, 1, 4, 5, true, true, 1, true, 1});
  cases.push_back({8, 1, 0, 3, 2, 2, 1, 4, 5, true, true, 2, true, 0});  // one CTA per rank, short last band
  cases.push_back({2, 1, 0, 6, 4, 1, 3, 8, 0, true, true, 1, true, 0});  // one CTA, no delays
  cases.push_back({2, 1, 0, 6, 4, 1, 3, 8, 0, true, true, 1, true, 3});
  return cases;
}

}  // namespace

int main() {
  if (const char* ms = std::getenv("EMU_TIMEOUT_MS")) g_timeout_ns = std::strtoull(ms, nullptr, 10) * 1000000ull;
  const std::vector<Case> cases = make_cases();
  unsigned seed = 1;
  for (const Case& c : cases) {
    // Named before it runs: a bounded wait that traps leaves this as the last line.
    std::printf("case tp=%d W=%d reducers=%d T=%d NT=%d R=%d slice=%d hopper=%d switching=%d push=%d fold=%d lag=%d\n",
                c.tp, c.W, c.reducers, c.T, c.NT, c.R, c.slice, (int)c.hopper, (int)c.switching, c.push, (int)c.fold,
                c.lag);
    std::fflush(stdout);
    const std::vector<uint64_t> a = run_case(c, seed, seed + 1000);
    if (c.push) {  // the same data pulled: the same bits
      Case pull = c;
      pull.push = 0;
      pull.fold = false;
      EMU_CHECK(a == run_case(pull, seed + 7000, seed + 1000), "tp=%d W=%d: push and pull outputs differ", c.tp, c.W);
    }
    // Same data, other interleaving: the outputs must be bitwise the same.
    if (c.tp >= 3 && c.W >= 2) {
      const std::vector<uint64_t> b = run_case(c, seed + 5000, seed + 1000);
      EMU_CHECK(a == b, "tp=%d W=%d: output differs between runs with the same data", c.tp, c.W);
    }
    ++seed;
  }
  // The bitwise checks only have teeth if the order of the terms matters.
  EMU_CHECK(g_order_sensitive > 0, "no element's sum depends on rank order: the data cannot catch order bugs");
  // Coverage: some reducer found its step unclaimed and waited for the builders.
  EMU_CHECK(g_claim_waits > 0, "no reducer ever waited for a claim: the claim wait was not exercised");
  std::printf("%zu cases, %ld order-sensitive sums, %ld reducer waits for claims, %d failures\n", cases.size(),
              g_order_sensitive, g_claim_waits, emu::g_failures);
  return emu::g_failures ? 1 : 0;
}
