// CPU emulation of the AG+GEMM scheduler: kernels/tp/ag_sched.h (the one CTA
// life, ag_cta), queue.h, sync.h and roles.h compiled for the host and driven
// by N ranks x W threads ("CTAs", every one resident, as the launchers
// guarantee) with random delays, several epochs back to back per rank (ranks
// drift apart). The movers' crew follows the launchers' rule (csrc/ag_tn_cuda.cu:
// with peers at least one mover; a fixed split keeps a builder), down to one CTA
// per rank. Builders claim tiles and wait for their rows as either engine's
// hooks do (portable: own tiles read x; Hopper ag_tn under pull: they wait for
// the publish), never moving.
// Checks: every move and build item runs exactly once per epoch; builds see the
// data of this epoch (no stale or overwritten buffer: a push that landed before
// the receiver's previous epoch was done shows as one); nothing hangs (bounded
// waits abort). Both transports (the Pull and Push types, each epoch's
// ag_cta instantiated for its own), and epochs alternating between them.
// ag_nn and bulk_ag_nn also pull straight from a source's x (AgParams::direct,
// per rank, also changing from epoch to epoch), which the "host" fills before
// each launch and overwrites as soon as it ends (XLA reusing the buffer): a
// source that ended its launch before its readers were done shows as a stale pull.
// Usage: ag_sched_emu  (runs the built-in grid; exit 0 = all passed)
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "kosmos/pull.h"
#include "kosmos/push.h"
#include "kosmos/queue.h"
#include "kosmos/sync.h"
#include "tp/ag_sched.h"

#include "emu_check.h"

using namespace kosmos;

namespace {

constexpr uint64_t kTimeoutNs = 20ull * 1000 * 1000 * 1000;

uint64_t tag(uint64_t e, int src, int t) { return (e << 32) | (uint64_t)(src << 16) | (uint64_t)t; }

// One rank's device memory: control words as in the kernel, plus payload slots.
struct Rank {
  uint64_t epoch = 0;
  uint32_t move_next = 0, build_next = 0, finished = 0;
  std::vector<uint64_t> done, ready, pub, arrived, gather;  // gather[src*T + t]
  std::vector<uint32_t> moved, built;                       // exactly-once counters
  std::vector<uint64_t> out;  // the gathered output (ag_nn, bulk_ag_nn): tag of each (src, t) row
  std::vector<uint64_t> x;    // this launch's input shard, tile row by tile row (the kernel's p.x)
  uint64_t src_epoch = 0, src_direct = 0;  // AgCtrl::src_epoch, src_ptr != 0
  Rank(int tp, int T, int NT)
      : done(tp, 0), ready(tp, 0), pub(T, 0), arrived(tp * T, 0), gather(tp * T, 0),
        moved(tp * T, 0), built(tp * T * NT, 0), out(tp * T, 0), x(T, 0) {}
};

struct Case {
  int tp, W, movers, T, NT, epochs, max_delay_us;  // movers: as asked; the launchers' rule applies
  int group = 1;               // AgShape::group: build-order swizzle
  bool hopper = false;         // Hopper builders: ag_tn's own tiles under pull wait for the publish
  bool switching = true;       // false: movers stop when their queue is empty (fixed split)
  int push = 0;                // 1: Push (Hopper builders only), 0: Pull; 2: alternate, pull on odd epochs
  // The backward ops on the same movers (pull): ag_nn returns the gathered
  // rows and its own tiles read dY itself (AgOp::kNn, kOwnFromX); bulk_ag_nn's
  // pulls land in the output only and its tiles wait for nothing (AgOp::kBulk,
  // tp/bulk_ag.cuh).
  enum Op { kTn, kNn, kBulk } op = kTn;
  // ag_nn, bulk_ag_nn: 0 every rank publishes into its slot; 1 every rank's
  // peers read its x directly; 2 direct on ranks and epochs of odd rank + epoch.
  int direct = 0;
  bool direct_at(int rank, uint64_t e) const {
    return op != kTn && tp > 1 && (direct == 1 || (direct == 2 && (rank + e) % 2 == 1));
  }
};

// The launchers' crew (csrc/ag_tn_cuda.cu, bulk_ag_nn_cuda.cu): builders never
// move, so with peers at least one mover; a fixed split keeps one builder (and
// needs two CTAs: no case asks for one).
int crew(const Case& c) {
  int mv = c.movers > c.W ? c.W : c.movers;
  if (c.tp > 1 && mv < 1) mv = 1;
  if (!c.switching && mv > c.W - 1) mv = c.W - 1;
  return mv;
}

// Tr: the epoch's transport, ag_cta's.
template <class Tr>
struct HostOps {
  const Case& c;
  std::vector<std::unique_ptr<Rank>>& ranks;
  int rank, cta;
  uint64_t e;
  std::mt19937 rng;
  AgShape s;

  Rank& me() { return *ranks[rank]; }
  void jitter() {
    if (c.max_delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % (c.max_delay_us + 1)));
  }
  WaitSite site(const char* flag, int idx) { return {"ag_emu", rank, cta, flag, idx}; }

  int claim_move() { jitter(); return (int)WorkQueue{&me().move_next, 0}.claim(); }
  int claim_build() { jitter(); return (int)WorkQueue{&me().build_next, 0}.claim(); }
  // Where the builders read their own shard's rows: the gather slot, after
  // the publish (the Hopper ag_tn under pull), or x itself.
  bool own_from_slot() const { return c.hopper && c.tp > 1 && !Tr::kPush && c.op == Case::kTn; }
  // Reuse rule, the least the protocol needs: our region is overwritten (by us
  // or by pushes) once every peer that read it in epoch e-1 is done, and only a
  // pull epoch has remote readers. (The kernel's heap_use_guard waits in either
  // case.) So after a push epoch nothing but ready[] holds back a fast peer's
  // pushes: the emulation checks that handshake on its own.
  bool prev_pull;
  void guard_data() {
    if (!prev_pull) return;
    for (int p = 0; p < c.tp; ++p)
      if (p != rank) wait_ge<Scope::kSys>(&me().done[p], e - 1, kTimeoutNs, site("done", p));
  }
  // The kernel's announce_source (tp/ag_ops.cuh), CTA 0 first thing: where our
  // rows are this epoch, rewritten once every peer ended the previous one.
  void announce_source() {
    if (c.op == Case::kTn) return;
    for (int p = 0; p < c.tp; ++p)
      if (p != rank) wait_ge<Scope::kSys>(&me().done[p], e - 1, kTimeoutNs, site("done(source)", p));
    jitter();
    __atomic_store_n(&me().src_direct, (uint64_t)c.direct_at(rank, e), __ATOMIC_RELAXED);
    store_release<Scope::kSys>(&me().src_epoch, e);
  }
  void announce_ready() {
    EMU_CHECK(Tr::kPush && c.hopper, "rank %d cta %d announces without the push transport", rank, cta);
    guard_data();
    jitter();
    for (int p = 0; p < c.tp; ++p)
      if (p != rank) store_release<Scope::kSys>(&ranks[p]->ready[rank], e);
  }
  void push(const AgMove& m) {
    Rank& peer = *ranks[m.dst];
    wait_ge<Scope::kSys>(&me().ready[m.dst], e, kTimeoutNs, site("peer_ready", m.dst));
    jitter();
    __atomic_store_n(&peer.gather[rank * c.T + m.t], tag(e, rank, m.t), __ATOMIC_RELAXED);
    store_release<Scope::kSys>(&peer.arrived[rank * c.T + m.t], e);
  }
  void move(const AgMove& m, int i) {
    __atomic_fetch_add(&me().moved[i], 1u, __ATOMIC_RELAXED);
    if (!m.publish && m.dst != rank) return push(m);
    if (m.publish) {
      guard_data();
      jitter();
      const uint64_t v = __atomic_load_n(&me().x[m.t], __ATOMIC_RELAXED);
      EMU_CHECK(v == tag(e, rank, m.t), "rank %d published a row (t %d) not of epoch %llu", rank, m.t,
                (unsigned long long)e);
      if (c.op != Case::kTn) me().out[rank * c.T + m.t] = v;
      if (c.direct_at(rank, e)) return;  // the peers read x itself
      __atomic_store_n(&me().gather[rank * c.T + m.t], v, __ATOMIC_RELAXED);
      store_release<Scope::kSys>(&me().pub[m.t], e);
      return;
    }
    Rank& peer = *ranks[m.src];
    bool direct = false;
    if (c.op != Case::kTn) {
      wait_ge<Scope::kSys>(&peer.src_epoch, e, kTimeoutNs, site("peer_source", m.src));
      direct = __atomic_load_n(&peer.src_direct, __ATOMIC_RELAXED) != 0;
    }
    if (!direct) wait_ge<Scope::kSys>(&peer.pub[m.t], e, kTimeoutNs, site("pub", m.t));
    jitter();  // the peer must not overwrite its slot (or end its launch) meanwhile
    const uint64_t v = direct ? __atomic_load_n(&peer.x[m.t], __ATOMIC_RELAXED)
                              : __atomic_load_n(&peer.gather[m.src * c.T + m.t], __ATOMIC_RELAXED);
    EMU_CHECK(v == tag(e, m.src, m.t), "rank %d pulled stale row (src %d, t %d) epoch %llu", rank, m.src,
              m.t, (unsigned long long)e);
    if (c.op != Case::kBulk) __atomic_store_n(&me().gather[m.src * c.T + m.t], v, __ATOMIC_RELAXED);
    if (c.op != Case::kTn) me().out[m.src * c.T + m.t] = v;
    store_release<Scope::kGpu>(&me().arrived[m.src * c.T + m.t], e);
  }
  // The engine over the build queue (AgSched): claim until empty; a peer tile
  // waits for its pull or the peer's push (by tile row, as the hooks'
  // before_tile does), an own tile for its publish where it reads the slot,
  // never moving itself. The move may not be claimed yet (movers drain the
  // queue without waiting on builders); a deadlock would show as a wait timeout.
  void build_all() {
    for (int j = claim_build(); j < ag_n_build(s); j = claim_build()) {
      const AgBuild b = ag_build_item(s, j);
      if (c.op == Case::kBulk) {  // dy @ w.T: reads no moved row, waits for nothing
        __atomic_fetch_add(&me().built[(b.src * c.T + b.t) * c.NT + b.tn], 1u, __ATOMIC_RELAXED);
        jitter();
        continue;
      }
      if (b.src != rank)
        wait_ge<Scope::kSys>(&me().arrived[b.src * c.T + b.t], e, kTimeoutNs, site("arrived", b.src * c.T + b.t));
      else if (own_from_slot())
        wait_ge<Scope::kSys>(&me().pub[b.t], e, kTimeoutNs, site("pub(local)", b.t));
      build(b);
    }
  }
  void build(const AgBuild& b) {
    if (b.src != rank || own_from_slot()) {
      const uint64_t v = __atomic_load_n(&me().gather[b.src * c.T + b.t], __ATOMIC_RELAXED);
      EMU_CHECK(v == tag(e, b.src, b.t), "rank %d built tile (src %d, t %d) on stale rows", rank, b.src, b.t);
    }
    __atomic_fetch_add(&me().built[(b.src * c.T + b.t) * c.NT + b.tn], 1u, __ATOMIC_RELAXED);
    jitter();
  }
  void finish(int grid) {
    if (add_acq_rel_gpu_u32(&me().finished, 1) != (uint32_t)grid - 1) return;
    for (int p = 0; p < c.tp; ++p)
      if (p != rank) store_release<Scope::kSys>(&ranks[p]->done[rank], e);
    // Direct: x outlives the launch only until it ends; the peers' reads first.
    if (c.direct_at(rank, e))
      for (int p = 0; p < c.tp; ++p)
        if (p != rank) wait_ge<Scope::kSys>(&me().done[p], e, kTimeoutNs, site("done(x read)", p));
    me().move_next = me().build_next = me().finished = 0;
    store_release<Scope::kGpu>(&me().epoch, e);
  }
};

// One launch of rank `rank` over transport Tr: W CTAs, then the exactly-once checks.
template <class Tr>
void run_epoch(const Case& c, std::vector<std::unique_ptr<Rank>>& ranks, int rank, unsigned seed, bool prev_pull) {
  const AgShape s{c.tp, rank, c.T, c.NT, c.group};
  Rank& r = *ranks[rank];
  const uint64_t e = load_acquire<Scope::kGpu>(&r.epoch) + 1;
  std::fill(r.moved.begin(), r.moved.end(), 0u);
  std::fill(r.built.begin(), r.built.end(), 0u);
  for (int t = 0; t < c.T; ++t) __atomic_store_n(&r.x[t], tag(e, rank, t), __ATOMIC_RELAXED);
  std::vector<std::thread> ctas;
  for (int cta = 0; cta < c.W; ++cta)
    ctas.emplace_back([&, cta] {
      HostOps<Tr> ops{c, ranks, rank, cta, e, std::mt19937(seed * 7919u + cta * 31u + (unsigned)e), s, prev_pull};
      ag_cta<Tr>(ops, s, cta, c.W, crew(c), c.switching);
    });
  for (auto& t : ctas) t.join();
  for (int t = 0; t < c.T; ++t) __atomic_store_n(&r.x[t], ~0ull, __ATOMIC_RELAXED);  // XLA reuses it
  for (int i = 0; i < ag_n_move<Tr>(s); ++i)
    EMU_CHECK(r.moved[i] == 1, "tp=%d W=%d rank %d epoch %llu: move %d ran %u times", c.tp, c.W, rank,
              (unsigned long long)e, i, r.moved[i]);
  for (int j = 0; j < ag_n_build(s); ++j) {
    const AgBuild b = ag_build_item(s, j);
    const uint32_t n = r.built[(b.src * c.T + b.t) * c.NT + b.tn];
    EMU_CHECK(n == 1, "tp=%d W=%d rank %d: tile (src %d, t %d, tn %d) built %u times", c.tp, c.W, rank,
              b.src, b.t, b.tn, n);
  }
  for (int q = 0; c.op != Case::kTn && c.tp > 1 && q < c.tp * c.T; ++q)  // the gathered output, complete
    EMU_CHECK(r.out[q] == tag(e, q / c.T, q % c.T), "tp=%d W=%d rank %d epoch %llu: gathered row (src %d, t %d) "
              "stale or missing", c.tp, c.W, rank, (unsigned long long)e, q / c.T, q % c.T);
}

void run_rank(const Case& c, std::vector<std::unique_ptr<Rank>>& ranks, int rank, unsigned seed) {
  auto push_at = [&](int it) { return c.push == 2 ? it % 2 == 0 : c.push != 0; };
  for (int it = 0; it < c.epochs; ++it) {
    const bool prev_pull = it > 0 && !push_at(it - 1);
    if (push_at(it)) run_epoch<Push>(c, ranks, rank, seed, prev_pull);
    else run_epoch<Pull>(c, ranks, rank, seed, prev_pull);
  }
}

}  // namespace

int main() {
  std::vector<Case> cases;
  // Both builders; movers 0 (runs as 1 with peers), 1 or the whole grid; one CTA per rank included.
  for (bool hopper : {false, true})
    for (int tp : {1, 2, 3, 4})
      for (int W : {1, 2, 5})
        for (int movers : {0, 1, W})
          for (int T : {1, 3}) cases.push_back({tp, W, movers, T, 2, 4, 20, T == 3 ? 2 : 1, hopper});
  for (bool hopper : {false, true}) {
    cases.push_back({8, 9, 1, 4, 3, 3, 5, 3, hopper});
    cases.push_back({8, 8, 2, 4, 3, 3, 5, 1, hopper});  // wider group
    cases.push_back({2, 1, 0, 6, 4, 6, 0, 1, hopper});  // one CTA, no delays: tight interleavings
  }
  // Fixed splits (switching off): 1 <= movers <= W - 1.
  for (int tp : {2, 3})
    for (bool hopper : {false, true})
      for (int movers : {1, 2}) cases.push_back({tp, 3, movers, 3, 4, 3, 20, 2, hopper, false});
  cases.push_back({2, 2, 0, 3, 4, 3, 20, 2, false, false});  // a fixed split of two CTAs: one mover
  // Push transport (Hopper builders): one CTA, all movers, fixed splits, 8
  // ranks, and epochs alternating with pull (the reuse rule across transports).
  for (int tp : {2, 3, 4})
    for (int W : {1, 3})
      for (int movers : {1, W})
        for (int push : {1, 2}) cases.push_back({tp, W, movers, 3, 4, 4, 20, 2, true, true, push});
  for (int push : {1, 2}) {
    cases.push_back({2, 3, 1, 3, 4, 4, 20, 2, true, false, push});
    cases.push_back({8, 9, 2, 4, 3, 4, 5, 3, true, true, push});
    cases.push_back({2, 1, 1, 6, 4, 8, 0, 1, true, true, push});
  }
  // The backward ops: ag_nn on both builders, bulk_ag_nn (whose builders wait
  // for nothing on either engine) once; one CTA, all movers, fixed splits, 8 ranks.
  for (Case::Op op : {Case::kNn, Case::kBulk})
    for (int tp : {1, 2, 3, 4})
      for (int W : {1, 3})
        for (int movers : {1, W})
          for (bool hopper : {false, true}) {
            if (op == Case::kBulk && hopper) continue;
            Case c{tp, W, movers, 3, 4, 3, 20, 2, hopper};
            c.op = op;
            cases.push_back(c);
          }
  for (Case::Op op : {Case::kNn, Case::kBulk}) {
    Case fixed{2, 3, 1, 3, 4, 3, 20, 2, false, false};
    Case wide{8, 9, 2, 4, 3, 3, 5, 3, false};
    fixed.op = wide.op = op;
    cases.push_back(fixed);
    cases.push_back(wide);
  }
  // Their direct pulls: every rank, or ranks changing between direct and the
  // slot from epoch to epoch; one CTA, all movers, a fixed split, 8 ranks.
  for (Case::Op op : {Case::kNn, Case::kBulk})
    for (int direct : {1, 2})
      for (int tp : {2, 3, 4})
        for (int W : {1, 3})
          for (bool hopper : {false, true}) {
            if (op == Case::kBulk && hopper) continue;
            Case c{tp, W, W == 1 ? 1 : 2, 3, 4, 5, 20, 2, hopper};
            c.op = op;
            c.direct = direct;
            cases.push_back(c);
          }
  for (Case::Op op : {Case::kNn, Case::kBulk})
    for (int direct : {1, 2}) {
      Case fixed{2, 3, 1, 3, 4, 4, 20, 2, false, false};
      Case wide{8, 9, 2, 4, 3, 4, 5, 3, false};
      Case tight{2, 1, 1, 6, 4, 8, 0, 1, false};  // one CTA, no delays
      for (Case* c : {&fixed, &wide, &tight}) {
        c->op = op;
        c->direct = direct;
        cases.push_back(*c);
      }
    }
  unsigned seed = 1;
  for (const Case& c : cases) {
    std::vector<std::unique_ptr<Rank>> ranks;
    for (int r = 0; r < c.tp; ++r) ranks.emplace_back(new Rank(c.tp, c.T, c.NT));
    std::vector<std::thread> drivers;
    for (int r = 0; r < c.tp; ++r) drivers.emplace_back(run_rank, std::cref(c), std::ref(ranks), r, seed++);
    for (auto& d : drivers) d.join();
    for (int r = 0; r < c.tp; ++r)
      EMU_CHECK(ranks[r]->epoch == (uint64_t)c.epochs, "rank %d ended at epoch %llu", r,
                (unsigned long long)ranks[r]->epoch);
  }
  std::printf("%zu cases, %d failures\n", cases.size(), emu::g_failures);
  return emu::g_failures ? 1 : 0;
}
