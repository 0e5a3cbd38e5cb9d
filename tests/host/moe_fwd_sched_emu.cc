// CPU emulation of the MoE schedules: kernels/moe/fwd_sched.h (the one CTA
// life, moe_fwd_cta) with the forward's build queue and with the backward's
// (moe/bwd_queues.h), plan.h, queue.h, sync.h compiled for the host and
// driven by ep ranks x W threads ("CTAs", all resident, as the launcher
// guarantees) with random delays, several epochs back to back per rank (ranks
// drift apart), routings that change from epoch to epoch: balanced, skewed,
// every token to the same k experts (k = 1: one expert), every token to one
// rank's experts (the other ranks get no rows at all); with and without a
// shared expert (row blocks past the arenas, every token, weight 1).
// The work is real, on small integer-valued floats (every sum exact, so any
// order gives the same bits): route copies the epoch's routing and histograms
// it, plan_scan / plan_scatter / moe_build_layout place the rows, the "GEMM1"
// is gate * up of x with per-expert weights, the "GEMM2" a product with a
// second weight, and the fold's output must equal a direct per-token
// computation: the layout, the offsets and the modes are right. Backward: the
// same plan, dispatch of w * dY rows (at EP > 1 then x rows in parts of their
// own, which only wgrad1 reads, after their flag), "dgrad2" (dact = dY W2^T,
// then the stand-in SwiGLU's backward: d gate = dact * up, d up = dact * gate), "dgrad1"
// (dX rows), the weight gradients of every local expert (all ranks' rows) and
// of the shared expert, the dX combine and fold, all against direct sums.
// Checks: every queue item runs exactly once per epoch and every flag is
// released once (units without rows: never); a GEMM1 tile reads only rows
// dispatched this epoch from sources whose arrival it saw; a GEMM2 row block
// only GEMM1 output of this epoch after its flag; a unit only finished GEMM2
// rows; the fold only rows whose unit has returned; pushes only into ranks
// whose previous epoch is over; the capped/dropless choice equals the overflow
// of the whole count table, and the layout fits the arena of its mode; nothing
// hangs (bounded waits trap, naming the flag).
// Usage: moe_fwd_sched_emu  (exit 0 = all passed; EMU_TIMEOUT_MS overrides the bound)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "kosmos/queue.h"
#include "kosmos/sync.h"
#include "moe/bwd_queues.h"
#include "moe/fwd_sched.h"

#include "emu_check.h"

using namespace kosmos;
using namespace kosmos::moe;

namespace {

uint64_t g_timeout_ns = 20ull * 1000 * 1000 * 1000;
long g_dropless = 0, g_capped = 0;  // rank-epochs run in each mode
long g_mixed = 0;                   // rank-epochs whose build queue spread the shared tiles (moe_mixes_shared)

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
uint64_t hash(std::initializer_list<uint64_t> v) {
  uint64_t h = 0x51ED27;
  for (uint64_t a : v) h = mix64(h ^ a);
  return h;
}
float small(uint64_t h, int lo, int hi) { return (float)(lo + (int)(h % (uint64_t)(hi - lo + 1))); }

enum Routing { kBalanced, kSkewed, kHot, kOneRank };

struct Case {
  int ep, W, movers, t, k, B, e_local, tile_m, nt1, nt2, groups, capacity, epochs, max_delay_us;
  std::vector<Routing> routings;  // epoch i routes with routings[i % size]
  bool shared = false;            // a shared expert: model expert E, row blocks from moe_max_row_blocks
  bool backward = false;          // the backward's build queue and work (main runs every case both ways)
  int H() const { return nt2; }   // one element per emulated column block
  int I() const { return nt1; }
  int E() const { return ep * e_local; }
  MoeFwdShape shape(int rank) const {
    // Bands of 1-3 row blocks in the build queue's tile order, varied over the cases.
    MoeFwdShape s{ep, rank, t, k, B, e_local, tile_m, nt1, nt2, groups, capacity, 0, 0, 1 + (W + t) % 3};
    s.x_parts = backward && ep > 1;  // the backward's X rows in parts of their own (moe/fwd_sched.h)
    if (shared) s.shared_rb0 = moe_max_row_blocks(s), s.shared_blocks = moe_cdiv(t, tile_m);
    return s;
  }
};

// Token i of rank r in epoch it: k distinct experts (a router's top-k), in slot order.
std::vector<int> route_token_of(const Case& c, int it, int r, int i) {
  std::mt19937 g((unsigned)hash({(uint64_t)it, (uint64_t)r, (uint64_t)i}));
  const int E = c.E();
  std::vector<int> out;
  while ((int)out.size() < c.k) {
    int e = 0;
    switch (c.routings[it % c.routings.size()]) {
      case kBalanced: e = (int)(g() % E); break;
      case kSkewed: e = (int)(E * std::pow((g() % 1000) / 1000.0, 3)); break;  // mostly the first experts
      case kHot: e = (int)out.size(); break;                                  // experts 0..k-1
      case kOneRank: e = (c.ep - 1) * c.e_local + (int)(g() % c.e_local); break;
    }
    if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
  }
  return out;
}

// Model weights (per case; expert E is the shared one) and one rank's inputs of an epoch.
struct Model {
  std::vector<float> w1g, w1u, w2;  // [E + 1][H][I], [E + 1][H][I], [E + 1][I][H]
  explicit Model(const Case& c) {
    const size_t n = (size_t)(c.E() + 1) * c.H() * c.I();
    for (size_t i = 0; i < n; ++i) {
      w1g.push_back(small(hash({1, i}), -2, 2));
      w1u.push_back(small(hash({2, i}), -2, 2));
      w2.push_back(small(hash({3, i}), -2, 2));
    }
  }
  // Gate and up [I] of row x[H] through expert e.
  void gate_up(const Case& c, int e, const float* x, float* g, float* u) const {
    const int H = c.H(), I = c.I();
    for (int n = 0; n < I; ++n) {
      g[n] = u[n] = 0;
      for (int h = 0; h < H; ++h) {
        g[n] += x[h] * w1g[((size_t)e * H + h) * I + n];
        u[n] += x[h] * w1u[((size_t)e * H + h) * I + n];
      }
    }
  }
  // The backward of expert() on row x for output gradient dy[H]: act, d gate,
  // d up [I] and the row's input gradient dx[H].
  void expert_bwd(const Case& c, int e, const float* x, const float* dy, float* act, float* dg, float* du,
                  float* dx) const {
    const int H = c.H(), I = c.I();
    std::vector<float> g(I), u(I);
    gate_up(c, e, x, g.data(), u.data());
    for (int n = 0; n < I; ++n) {
      float da = 0;
      for (int m = 0; m < H; ++m) da += dy[m] * w2[((size_t)e * I + n) * H + m];
      act[n] = g[n] * u[n], dg[n] = da * u[n], du[n] = da * g[n];
    }
    for (int h = 0; h < H; ++h) {
      dx[h] = 0;
      for (int n = 0; n < I; ++n)
        dx[h] += dg[n] * w1g[((size_t)e * H + h) * I + n] + du[n] * w1u[((size_t)e * H + h) * I + n];
    }
  }
  // act[I] of row x[H] through expert e (gate * up: SwiGLU's integer stand-in), then y[H].
  void expert(const Case& c, int e, const float* x, float* act, float* y) const {
    const int H = c.H(), I = c.I();
    for (int n = 0; n < I; ++n) {
      float g = 0, u = 0;
      for (int h = 0; h < H; ++h) {
        g += x[h] * w1g[((size_t)e * H + h) * I + n];
        u += x[h] * w1u[((size_t)e * H + h) * I + n];
      }
      act[n] = g * u;
    }
    for (int m = 0; m < H; ++m) {
      float acc = 0;
      for (int n = 0; n < I; ++n) acc += act[n] * w2[((size_t)e * I + n) * H + m];
      y[m] = acc;
    }
  }
};

struct Inputs {
  std::vector<int> idx;         // [t * k]
  std::vector<float> w, x, dy;  // [t * k] router weights, [t * H] tokens, [t * H] output gradients
  Inputs(const Case& c, int it, int r) {
    for (int i = 0; i < c.t; ++i) {
      for (int e : route_token_of(c, it, r, i)) idx.push_back(e);
      const uint64_t at = hash({(uint64_t)it, (uint64_t)r, (uint64_t)i});
      for (int j = 0; j < c.k; ++j) w.push_back(small(hash({4, at, (uint64_t)j}), -3, 3));
      for (int h = 0; h < c.H(); ++h) x.push_back(small(hash({5, at, (uint64_t)h}), -3, 3));
      for (int h = 0; h < c.H(); ++h) dy.push_back(small(hash({6, at, (uint64_t)h}), -3, 3));
    }
  }
  // Pair p's dispatched output gradient (output gating: w * dY).
  float dy_row(const Case& c, int p, int h) const { return w[p] * dy[(size_t)(p / c.k) * c.H() + h]; }
};

// Whether some (source, expert) count of epoch it exceeds the capacity: the
// mode every rank must pick.
bool overflows(const Case& c, int it) {
  for (int r = 0; r < c.ep; ++r) {
    std::vector<int> counts(c.E(), 0);
    for (int e : Inputs(c, it, r).idx) ++counts[e];
    for (int n : counts)
      if (n > c.capacity) return true;
  }
  return false;
}

uint64_t row_tag(uint64_t e, int src, int i) { return (e << 40) | ((uint64_t)src << 32) | (uint32_t)i; }
int tag_src(uint64_t tag) { return (int)((tag >> 32) & 0xFF); }
uint64_t tag_epoch(uint64_t tag) { return tag >> 40; }

constexpr int kFlags = kMoeFlags, kQueues = 5;

// Row blocks with GEMM flags: every arena's, then the shared expert's.
int row_blocks(const MoeFwdShape& s) {
  return s.shared_blocks > 0 ? s.shared_rb0 + s.shared_blocks : moe_max_row_blocks(s);
}


// Backward: y holds the dX rows (the second GEMM's output, as the forward's
// y rows), dy the dispatched output gradients, dg / du the first GEMM's; xfwd
// the forward's input row, which stands for what the forward left at the owner
// (act and h1, which dgrad2 reads), x the X rows wgrad1 reads (at EP > 1 they
// come in X parts of their own, tagged in xtag).
struct Arena {
  std::vector<float> x, xfwd, act, y, dy, dg, du;  // [rows][H] x 2, [rows][I], [rows][H] x 2, [rows][I] x 2
  std::vector<uint64_t> tag, xtag;                 // [rows] (epoch, source) of the dispatched row, of its X row
  std::vector<uint64_t> act_e, y_e;                // [rows][I], [rows][H] epoch each element was computed in
  Arena(int rows, int H, int I)
      : x((size_t)rows * H), xfwd((size_t)rows * H), act((size_t)rows * I), y((size_t)rows * H),
        dy((size_t)rows * H), dg((size_t)rows * I), du((size_t)rows * I), tag(rows), xtag(rows),
        act_e((size_t)rows * I), y_e((size_t)rows * H) {}
};

// One rank's device memory: control words as in the kernel, plan, arenas.
struct Rank {
  uint64_t epoch = 0;
  uint32_t queue[kQueues] = {}, finished = 0, routed = 0, scattered = 0;
  std::vector<uint32_t> parts, xparts, g1, g2;  // counters: [E] by (dst, x) x 2, [row blocks] x 2
  std::vector<uint64_t> flags[kFlags];  // by MoeFlag
  std::vector<int> table;               // [ep][E] exchanged counts
  std::vector<int> idx, hist, counts, start1, pos, order;
  std::vector<float> w;
  std::unique_ptr<MoeLayout> layout{new MoeLayout()};
  Arena arena[2];                       // capped, dropless
  Arena shared;                         // the shared expert's rows (s.shared_blocks * tile_m)
  std::vector<float> ret, out;          // [t*k][H] return buffer, [t][H] fold output (backward: dX)
  std::vector<uint64_t> ret_tag;        // [t*k]
  // Backward: weight gradients of the local experts and the shared one (x = e_local).
  std::vector<float> dw2, dw1g, dw1u;   // [E_l + 1][I][H], [E_l + 1][H][I] x 2
  // Per epoch: runs of each queue item, releases of each flag (at home * size + i), scans.
  std::vector<uint32_t> ran[kQueues], released[kFlags];
  uint32_t scans = 0;
  Rank(const Case& c, const MoeFwdShape& s)
      : parts(c.E()), xparts(c.E()), g1(row_blocks(s)), g2(row_blocks(s)), table((size_t)c.ep * c.E()),
        idx(c.t * c.k), hist((size_t)moe_blocks(s) * c.E()), counts(c.E()), start1(c.E() + 1), pos(c.t * c.k),
        order(c.t * c.k), w(c.t * c.k),
        arena{Arena(moe_arena_rows(s, false), c.H(), c.I()), Arena(moe_arena_rows(s, true), c.H(), c.I())},
        shared(s.shared_blocks * s.tile_m, c.H(), c.I()), ret((size_t)c.t * c.k * c.H()), out((size_t)c.t * c.H()),
        ret_tag(c.t * c.k), dw2((size_t)(c.e_local + 1) * c.I() * c.H()), dw1g(dw2.size()), dw1u(dw2.size()) {
    const int sizes[kFlags] = {c.ep, c.ep, 1, 1, 1, c.E(), row_blocks(s), row_blocks(s), c.E(), c.E()};
    for (int f = 0; f < kFlags; ++f) {
      flags[f].assign(sizes[f], 0);
      released[f].assign((size_t)c.ep * sizes[f], 0);
    }
  }
};
using Ranks = std::vector<std::unique_ptr<Rank>>;


struct HostOps {
  const Case& c;
  Ranks& ranks;
  const Model& model;
  const Inputs& in;
  int rank, cta;
  uint64_t e;
  std::mt19937 rng;
  MoeFwdShape s;

  Rank& me() { return *ranks[rank]; }
  const MoeLayout& layout() { return *me().layout; }
  const MoeLayout& local_layout() { return layout(); }
  const int* ends() { return me().hist.data(); }
  Arena& arena() { return me().arena[layout().dropless]; }
  void jitter() {
    if (c.max_delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % (c.max_delay_us + 1)));
  }
  uint64_t* flag(int home, MoeFlag f, int i) {
    std::vector<uint64_t>& v = ranks[home]->flags[(int)f];
    if (i < 0 || i >= (int)v.size()) {
      std::printf("FAIL flag %s[%d] out of range (%zu)\n", moe_flag_name(f), i, v.size());
      std::abort();
    }
    return &v[i];
  }
  void ran(MoeQueue q, int i) { __atomic_fetch_add(&me().ran[(int)q][i], 1u, __ATOMIC_RELAXED); }
  // A push into rank d of epoch e: d's previous epoch must be over (kReady).
  void check_ready(int d, const char* what) {
    EMU_CHECK(load_acquire<Scope::kSys>(&ranks[d]->epoch) + 1 >= e, "rank %d cta %d pushes %s into rank %d, which "
              "is still in epoch %llu", rank, cta, what, d, (unsigned long long)ranks[d]->epoch + 1);
  }
  bool seen(MoeFlag f, int i) { return load_acquire<Scope::kSys>(flag(rank, f, i)) >= e; }

  // ---- control ----
  int claim(MoeQueue q) {
    jitter();
    return (int)WorkQueue{&me().queue[(int)q], 0}.claim();
  }
  bool count(MoeCount k, int i, int target) {
    uint32_t* p = k == MoeCount::kRouted ? &me().routed : k == MoeCount::kScattered ? &me().scattered
                : k == MoeCount::kParts ? &me().parts[i] : k == MoeCount::kXParts ? &me().xparts[i]
                : k == MoeCount::kGemm1 ? &me().g1[i] : &me().g2[i];
    if (add_acq_rel_gpu_u32(p, 1) + 1 != (uint32_t)target) return false;
    __atomic_store_n(p, 0u, __ATOMIC_RELAXED);  // re-armed: no other add this launch
    return true;
  }
  void release(MoeFlag f, int home, int i) {
    jitter();
    __atomic_fetch_add(&me().released[(int)f][(size_t)home * ranks[home]->flags[(int)f].size() + i], 1u,
                       __ATOMIC_RELAXED);
    store_release<Scope::kSys>(flag(home, f, i), e);
  }
  void wait(MoeFlag f, int i) {
    wait_ge<Scope::kSys>(flag(rank, f, i), e, g_timeout_ns, {"moe_fwd_emu", rank, cta, moe_flag_name(f), i});
  }
  bool test(MoeFlag f, int i) { return seen(f, i); }
  template <class Pred>
  void wait_each(MoeFlag f, int n, const Pred& pred) {
    for (int i = 0; i < n; ++i)
      if (pred(i)) wait(f, i);
  }
  void announce_ready() {
    EMU_CHECK(cta == 0, "rank %d: cta %d announces", rank, cta);
    for (int r = 0; r < c.ep; ++r) store_release<Scope::kSys>(flag(r, MoeFlag::kReady, rank), e);
  }
  void finish(int grid) {
    if (add_acq_rel_gpu_u32(&me().finished, 1) != (uint32_t)grid - 1) return;
    for (uint32_t& q : me().queue) q = 0;
    me().finished = 0;
    store_release<Scope::kGpu>(&me().epoch, e);
  }

  // ---- front ----
  void route(int b) {
    ran(MoeQueue::kFront, b);
    int first, last;
    plan_block_pairs(moe_plan_shape(s), b, &first, &last);
    for (int p = first; p < last; ++p) {
      me().idx[p] = in.idx[p];
      me().w[p] = in.w[p];
    }
    jitter();
    plan_histogram(me().idx.data(), moe_plan_shape(s), b, me().hist.data() + (size_t)b * c.E());
  }
  void scan() {
    ++me().scans;
    plan_scan(me().hist.data(), moe_plan_shape(s), me().counts.data(), 0, 1);
    plan_segments<1>(me().counts.data(), c.E(), me().start1.data());
  }
  void send_counts(int d) {
    check_ready(d, "counts");
    std::copy(me().counts.begin(), me().counts.end(), ranks[d]->table.begin() + (size_t)rank * c.E());
  }
  void scatter(int b) {
    ran(MoeQueue::kFront, moe_blocks(s) + b);
    plan_scatter(me().idx.data(), moe_plan_shape(s), b, me().hist.data() + (size_t)b * c.E(), me().start1.data(),
                 me().pos.data(), me().order.data());
  }
  void build_layout() {
    ran(MoeQueue::kFront, 2 * moe_blocks(s));
    moe_build_layout(s, me().table.data(), me().layout.get());
    const MoeLayout& L = layout();
    const int rows = moe_row_blocks(s, L) * c.tile_m;
    EMU_CHECK(L.dropless == overflows(c, (int)e - 1), "rank %d epoch %llu: dropless %d, the counts say %d", rank,
              (unsigned long long)e, L.dropless, (int)overflows(c, (int)e - 1));
    EMU_CHECK(rows <= moe_arena_rows(s, L.dropless), "rank %d epoch %llu: layout of %d rows, %s arena of %d", rank,
              (unsigned long long)e, rows, L.dropless ? "dropless" : "capped", moe_arena_rows(s, L.dropless));
    __atomic_fetch_add(L.dropless ? &g_dropless : &g_capped, 1, __ATOMIC_RELAXED);
    if (moe_mixes_shared(s, L)) __atomic_fetch_add(&g_mixed, 1, __ATOMIC_RELAXED);
  }

  // ---- dispatch, GEMMs, combine, fold ----
  void push_part(const MoeMove& m) {
    ran(MoeQueue::kMove, (m.x * c.groups + m.g) * c.ep + (m.dst - rank - 1 + c.ep) % c.ep + m.xrows * moe_n_parts(s));
    const int ex = m.dst * c.e_local + m.x, at = layout().dst[ex], H = c.H();
    int begin, end;
    moe_part_rows(s, ends(), m, &begin, &end);
    if (end > begin) check_ready(m.dst, "rows");
    Arena& to = ranks[m.dst]->arena[layout().dropless];
    for (int r = begin; r < end; ++r) {
      const int p = me().order[me().start1[ex] + r];
      EMU_CHECK(me().idx[p] == ex && at + r < (int)to.tag.size(), "rank %d: part row %d of expert %d", rank, r, ex);
      const auto xr = in.x.begin() + (size_t)(p / c.k) * H;
      if (m.xrows) {  // the backward's X part (EP > 1)
        std::copy(xr, xr + H, to.x.begin() + (size_t)(at + r) * H);
        __atomic_store_n(&to.xtag[at + r], row_tag(e, rank, p), __ATOMIC_RELAXED);
        continue;
      }
      std::copy(xr, xr + H, to.xfwd.begin() + (size_t)(at + r) * H);
      if (!s.x_parts) std::copy(xr, xr + H, to.x.begin() + (size_t)(at + r) * H);  // EP = 1: the forward's rows
      if (c.backward)
        for (int h = 0; h < H; ++h) to.dy[(size_t)(at + r) * H + h] = in.dy_row(c, p, h);
      __atomic_store_n(&to.tag[at + r], row_tag(e, rank, p), __ATOMIC_RELAXED);
    }
    check_segment(m, ex, at);
    jitter();
  }
  // The device's padding rule (fwd_ops.cuh push_part): the last group's part of the last
  // source with rows zeroes rows [rows, padded) from the segment's start, which it finds
  // from the table alone as at - before. Checked against the owner's own layout of the
  // same table: the same start, the same rows, and the last source's rows end there.
  void check_segment(const MoeMove& m, int ex, int at) {
    if (m.g != c.groups - 1) return;
    const MoeSegment g = moe_segment(s, me().table.data(), ex, rank);
    MoeFwdShape owner = s;
    owner.rank = m.dst;
    MoeLayout L{};
    moe_layout_own(owner, me().table.data(), &L);
    EMU_CHECK(g.rows == moe_src(owner, L, m.x, c.ep) && g.before == moe_src(owner, L, m.x, rank) &&
                  at - g.before == L.rb[m.x] * c.tile_m,
              "rank %d: segment of expert %d at rank %d: rows %d before %d start %d", rank, ex, m.dst, g.rows,
              g.before, at - g.before);
    EMU_CHECK(g.last_src < 0 || moe_src(owner, L, m.x, g.last_src + 1) == g.rows,
              "rank %d: expert %d's last source %d", rank, ex, g.last_src);
  }
  // Source of segment row lr of local expert x (-1: padding).
  int source_of(int x, int lr) {
    for (int src = 0; src < c.ep; ++src)
      if (lr >= moe_src(s, layout(), x, src) && lr < moe_src(s, layout(), x, src + 1)) return src;
    return -1;
  }
  MoeWgradTiles wgrad_tiles() const { return {c.I(), c.H()}; }  // a row of dW2 [I][H] / dW1 [H][I] each
  int build(const MoeLayout& L, int most) {
    if (c.backward) return moe_build_serial(MoeBwdBuilds<HostOps>{*this, s, L, wgrad_tiles()}, most);
    return moe_build_serial(MoeBuilds<HostOps>{*this, s, L}, most);
  }
  // The build item that is tile t (a search over the direction's queue).
  int build_index(const MoeTile& t) {
    const int n = c.backward ? moe_n_bwd_build(s, layout(), wgrad_tiles()) : moe_n_build(s, layout());
    for (int j = 0; j < n; ++j) {
      const MoeTile u = c.backward ? moe_bwd_build_item(s, layout(), wgrad_tiles(), j) : moe_build_item(s, layout(), j);
      if (u.gemm == t.gemm && u.rb == t.rb && u.x == t.x && u.n == t.n) return j;
    }
    EMU_CHECK(false, "rank %d: tile (%d, %d, %d, %d) is no build item", rank, t.gemm, t.rb, t.x, t.n);
    return 0;
  }
  // The shared expert's GEMM1: x's token rows (tokens past t: padding, never read).
  void shared_gemm1(const MoeTile& t) {
    Arena& a = me().shared;
    const int H = c.H(), I = c.I();
    for (int i = 0; i < c.tile_m; ++i) {
      const int row = (t.rb - s.shared_rb0) * c.tile_m + i;
      float v = NAN;
      if (row < c.t) {
        std::vector<float> act(I), y(H);
        model.expert(c, c.E(), &in.x[(size_t)row * H], act.data(), y.data());
        v = act[t.n];
      }
      a.act[(size_t)row * I + t.n] = v;
      __atomic_store_n(&a.act_e[(size_t)row * I + t.n], e, __ATOMIC_RELAXED);
    }
  }
  void gemm1(const MoeTile& t) {
    ran(MoeQueue::kBuild, build_index(t));
    if (t.x == c.e_local) {
      shared_gemm1(t);
      jitter();
      return;
    }
    Arena& a = arena();
    const int H = c.H(), I = c.I(), ge = rank * c.e_local + t.x;
    for (int i = 0; i < c.tile_m; ++i) {
      const int row = t.rb * c.tile_m + i, src = source_of(t.x, (t.rb - layout().rb[t.x]) * c.tile_m + i);
      float v = NAN;  // padding rows: computed, never read
      if (src >= 0) {
        const uint64_t tag = __atomic_load_n(&a.tag[row], __ATOMIC_RELAXED);
        EMU_CHECK(seen(MoeFlag::kArrived, src * c.e_local + t.x) && tag_epoch(tag) == e && tag_src(tag) == src,
                  "rank %d epoch %llu: GEMM1 row %d (expert %d, source %d) before its rows arrived (tag %llx)", rank,
                  (unsigned long long)e, row, t.x, src, (unsigned long long)tag);
        std::vector<float> act(I), y(H);
        model.expert(c, ge, &a.x[(size_t)row * H], act.data(), y.data());
        v = act[t.n];
      }
      a.act[(size_t)row * I + t.n] = v;
      __atomic_store_n(&a.act_e[(size_t)row * I + t.n], e, __ATOMIC_RELAXED);
    }
    jitter();
  }
  void gemm2(const MoeTile& t) {
    ran(MoeQueue::kBuild, build_index(t));
    const bool sh = t.x == c.e_local;
    Arena& a = sh ? me().shared : arena();
    const int H = c.H(), I = c.I(), ge = sh ? c.E() : rank * c.e_local + t.x;
    EMU_CHECK(seen(MoeFlag::kGemm1, t.rb), "rank %d: GEMM2 of row block %d before its GEMM1", rank, t.rb);
    for (int i = 0; i < c.tile_m; ++i) {
      const int row = (sh ? t.rb - s.shared_rb0 : t.rb) * c.tile_m + i;
      float acc = 0;
      for (int n = 0; n < I; ++n) {
        EMU_CHECK(__atomic_load_n(&a.act_e[(size_t)row * I + n], __ATOMIC_RELAXED) == e,
                  "rank %d epoch %llu: GEMM2 row %d reads GEMM1 column %d not done", rank, (unsigned long long)e,
                  row, n);
        acc += a.act[(size_t)row * I + n] * model.w2[((size_t)ge * I + n) * H + t.n];
      }
      a.y[(size_t)row * H + t.n] = acc;
      __atomic_store_n(&a.y_e[(size_t)row * H + t.n], e, __ATOMIC_RELAXED);
    }
    jitter();
  }
  // ---- backward tiles ----
  // A row of the tile's row block: its arena (the shared expert's, or the mode's),
  // its row there, and its x and dY rows (nullptr: padding). Routed rows only
  // after their source's arrival, as GEMM1 reads them.
  Arena& tile_arena(const MoeTile& t) { return t.x == c.e_local ? me().shared : arena(); }
  int tile_row(const MoeTile& t, int i) {
    return (t.x == c.e_local ? t.rb - s.shared_rb0 : t.rb) * c.tile_m + i;
  }
  bool bwd_inputs(const MoeTile& t, int i, const float** x, const float** dy) {
    const int row = tile_row(t, i), H = c.H();
    if (t.x == c.e_local) {
      if (row >= c.t) return false;
      *x = &in.x[(size_t)row * H], *dy = &in.dy[(size_t)row * H];  // the shared expert: weight 1
      return true;
    }
    const int src = source_of(t.x, (t.rb - layout().rb[t.x]) * c.tile_m + i);
    if (src < 0) return false;
    const uint64_t tag = __atomic_load_n(&arena().tag[row], __ATOMIC_RELAXED);
    EMU_CHECK(seen(MoeFlag::kArrived, src * c.e_local + t.x) && tag_epoch(tag) == e && tag_src(tag) == src,
              "rank %d epoch %llu: dgrad2 row %d (expert %d, source %d) before its rows arrived", rank,
              (unsigned long long)e, row, t.x, src);
    *x = &arena().xfwd[(size_t)row * H], *dy = &arena().dy[(size_t)row * H];
    return true;
  }
  int model_expert(int x) const { return x == c.e_local ? c.E() : rank * c.e_local + x; }
  // dact's column t.n, then d gate, d up and act of that column (padding rows: NaN, never read).
  void dgrad2(const MoeTile& t) {
    ran(MoeQueue::kBuild, build_index(t));
    Arena& a = tile_arena(t);
    const int H = c.H(), I = c.I();
    std::vector<float> act(I), dg(I), du(I), dx(H);
    for (int i = 0; i < c.tile_m; ++i) {
      const size_t at = (size_t)tile_row(t, i) * I + t.n;
      const float *x = nullptr, *dy = nullptr;
      a.act[at] = a.dg[at] = a.du[at] = NAN;
      if (bwd_inputs(t, i, &x, &dy)) {
        model.expert_bwd(c, model_expert(t.x), x, dy, act.data(), dg.data(), du.data(), dx.data());
        a.act[at] = act[t.n], a.dg[at] = dg[t.n], a.du[at] = du[t.n];
      }
      __atomic_store_n(&a.act_e[at], e, __ATOMIC_RELAXED);
    }
    jitter();
  }
  // Column t.n of the dX rows, from every column of d gate / d up (after kGemm1).
  void dgrad1(const MoeTile& t) {
    ran(MoeQueue::kBuild, build_index(t));
    Arena& a = tile_arena(t);
    const int H = c.H(), I = c.I(), ge = model_expert(t.x);
    EMU_CHECK(seen(MoeFlag::kGemm1, t.rb), "rank %d: dgrad1 of row block %d before its dgrad2", rank, t.rb);
    for (int i = 0; i < c.tile_m; ++i) {
      const int row = tile_row(t, i);
      float acc = 0;
      for (int n = 0; n < I; ++n) {
        EMU_CHECK(__atomic_load_n(&a.act_e[(size_t)row * I + n], __ATOMIC_RELAXED) == e,
                  "rank %d epoch %llu: dgrad1 row %d reads dgrad2 column %d not done", rank, (unsigned long long)e,
                  row, n);
        acc += a.dg[(size_t)row * I + n] * model.w1g[((size_t)ge * H + t.n) * I + n] +
               a.du[(size_t)row * I + n] * model.w1u[((size_t)ge * H + t.n) * I + n];
      }
      a.y[(size_t)row * H + t.n] = acc;
      __atomic_store_n(&a.y_e[(size_t)row * H + t.n], e, __ATOMIC_RELAXED);
    }
    jitter();
  }
  // Expert x's rows (routed: its segment's rows from every source; shared: the
  // tokens) in order, each checked done by dgrad2 (column n; -1: every column).
  std::vector<int> wgrad_rows(int x, int n) {
    std::vector<int> rows;
    const int first = x == c.e_local ? 0 : layout().rb[x] * c.tile_m;
    const int count = x == c.e_local ? c.t : moe_src(s, layout(), x, c.ep);
    const Arena& a = x == c.e_local ? me().shared : arena();
    for (int r = first; r < first + count; ++r) {
      for (int k = n < 0 ? 0 : n; k < (n < 0 ? c.I() : n + 1); ++k)
        EMU_CHECK(__atomic_load_n(&a.act_e[(size_t)r * c.I() + k], __ATOMIC_RELAXED) == e,
                  "rank %d epoch %llu: wgrad of expert %d reads row %d before its dgrad2", rank,
                  (unsigned long long)e, x, r);
      rows.push_back(r);
    }
    return rows;
  }
  // Row t.n of dW2[x] [I][H]: act[:, n]^T dY rows.
  void wgrad2(const MoeTile& t) {
    ran(MoeQueue::kBuild, build_index(t));
    const bool sh = t.x == c.e_local;
    const Arena& a = sh ? me().shared : arena();
    const int H = c.H(), I = c.I();
    std::vector<float> acc(H, 0.f);
    for (int r : wgrad_rows(t.x, t.n))
      for (int m = 0; m < H; ++m) acc[m] += a.act[(size_t)r * I + t.n] * (sh ? in.dy : a.dy)[(size_t)r * H + m];
    std::copy(acc.begin(), acc.end(), me().dw2.begin() + ((size_t)t.x * I + t.n) * H);
    jitter();
  }
  // Row t.n (of H) of dW1[x]'s gate and up halves [H][I]: x rows^T d gate / d up.
  void wgrad1(const MoeTile& t) {
    ran(MoeQueue::kBuild, build_index(t));
    const bool sh = t.x == c.e_local;
    const Arena& a = sh ? me().shared : arena();
    const int H = c.H(), I = c.I();
    std::vector<float> g(I, 0.f), u(I, 0.f);
    for (int r : wgrad_rows(t.x, -1)) {
      if (!sh && s.x_parts) {  // the X row arrived in this epoch, from its source, after its flag
        const int src = source_of(t.x, r - layout().rb[t.x] * c.tile_m);
        const uint64_t tag = __atomic_load_n(&a.xtag[r], __ATOMIC_RELAXED);
        EMU_CHECK(seen(MoeFlag::kXArrived, src * c.e_local + t.x) && tag_epoch(tag) == e && tag_src(tag) == src,
                  "rank %d epoch %llu: wgrad1 of expert %d reads X row %d (source %d) before it arrived", rank,
                  (unsigned long long)e, t.x, r, src);
      }
      const float xv = (sh ? in.x : a.x)[(size_t)r * H + t.n];
      for (int k = 0; k < I; ++k) g[k] += xv * a.dg[(size_t)r * I + k], u[k] += xv * a.du[(size_t)r * I + k];
    }
    std::copy(g.begin(), g.end(), me().dw1g.begin() + ((size_t)t.x * H + t.n) * I);
    std::copy(u.begin(), u.end(), me().dw1u.begin() + ((size_t)t.x * H + t.n) * I);
    jitter();
  }
  bool y_done(const Arena& a, int row) {
    for (int m = 0; m < c.H(); ++m)
      if (__atomic_load_n(&a.y_e[(size_t)row * c.H() + m], __ATOMIC_RELAXED) != e) return false;
    return true;
  }
  void push_unit(const MoeUnit& u) {
    int row;
    const int rows = moe_unit_rows(s, layout(), u, &row), at = layout().ret[u.dst * c.e_local + u.x], H = c.H();
    check_ready(u.dst, "a unit");
    Rank& owner = *ranks[u.dst];
    const Arena& a = arena();
    for (int r = 0; r < rows; ++r) {
      EMU_CHECK(y_done(a, row + r), "rank %d epoch %llu: unit (x %d, dst %d) pushes row %d before its GEMM2", rank,
                (unsigned long long)e, u.x, u.dst, row + r);
      std::copy(a.y.begin() + (size_t)(row + r) * H, a.y.begin() + (size_t)(row + r + 1) * H,
                owner.ret.begin() + (size_t)(at + r) * H);
      __atomic_store_n(&owner.ret_tag[at + r], row_tag(e, rank, u.x), __ATOMIC_RELAXED);
    }
    jitter();
  }
  void fold(int item, int first, int last) {
    ran(MoeQueue::kFold, item);
    const int H = c.H(), k = c.k, slots = k + (s.shared_blocks > 0);
    for (int i = first; i < last; ++i) {
      std::vector<const float*> rows(slots);
      // Backward: the dY rows went out scaled by w, so the dX rows fold with weight 1.
      std::vector<float> w(me().w.begin() + (size_t)i * k, me().w.begin() + (size_t)(i + 1) * k);
      if (c.backward) std::fill(w.begin(), w.end(), 1.f);
      if (slots > k) {  // the shared expert's row, weight 1
        EMU_CHECK(seen(MoeFlag::kGemm2, s.shared_rb0 + i / c.tile_m) && y_done(me().shared, i),
                  "rank %d epoch %llu: fold of token %d before its shared expert row", rank, (unsigned long long)e, i);
        rows[k] = &me().shared.y[(size_t)i * H];
        w.push_back(1.f);
      }
      for (int j = 0; j < k; ++j) {
        const int p = i * k + j, ex = me().idx[p];
        const MoeRowRef ref = moe_pair_row(s, layout(), me().start1.data(), ex, me().pos[p]);
        bool ok = seen(MoeFlag::kReturned, ex);
        if (ref.local) {
          ok = ok && y_done(arena(), ref.row);
          rows[j] = &arena().y[(size_t)ref.row * H];
        } else {
          const uint64_t tag = __atomic_load_n(&me().ret_tag[ref.row], __ATOMIC_RELAXED);
          ok = ok && tag == row_tag(e, ex / c.e_local, ex % c.e_local);
          rows[j] = &me().ret[(size_t)ref.row * H];
        }
        EMU_CHECK(ok, "rank %d epoch %llu: fold of token %d slot %d (expert %d) before its row returned", rank,
                  (unsigned long long)e, i, j, ex);
      }
      moe_fold_token(slots, w.data(), H, 0, 1, [&](int j, int m) { return rows[j][m]; },
                     [&](int m, float v) { me().out[(size_t)i * H + m] = v; });
    }
    jitter();
  }
};

void expect_once(const std::vector<uint32_t>& v, int n, const char* what, const Case& c, int rank, uint64_t e) {
  for (int i = 0; i < (int)v.size(); ++i)
    EMU_CHECK(v[i] == (i < n ? 1u : 0u), "ep=%d W=%d rank %d epoch %llu: %s %d ran %u times", c.ep, c.W, rank,
              (unsigned long long)e, what, i, v[i]);
}

// Backward: dX against each token's pairs' input gradients summed directly, and
// every weight gradient of this rank (its local experts: every rank's pairs
// routed to them; the shared expert: its own tokens) against direct sums.
// Integer-valued sums below 2^24: exact in any order.
void check_backward(const Case& c, const Model& model, const Inputs& in, Rank& r, int rank, uint64_t e) {
  const int H = c.H(), I = c.I(), El = c.e_local;
  std::vector<float> act(I), dg(I), du(I), dx(H), dyr(H), want(H);
  std::vector<float> w2((size_t)(El + 1) * I * H, 0.f), w1g(w2.size(), 0.f), w1u(w2.size(), 0.f);
  auto add_grads = [&](int x, const float* xr) {
    for (int n = 0; n < I; ++n)
      for (int m = 0; m < H; ++m) {
        w2[((size_t)x * I + n) * H + m] += act[n] * dyr[m];
        w1g[((size_t)x * H + m) * I + n] += xr[m] * dg[n];
        w1u[((size_t)x * H + m) * I + n] += xr[m] * du[n];
      }
  };
  for (int i = 0; i < c.t; ++i) {
    const float* xr = &in.x[(size_t)i * H];
    std::fill(want.begin(), want.end(), 0.f);
    for (int j = 0; j < c.k; ++j) {
      for (int h = 0; h < H; ++h) dyr[h] = in.dy_row(c, i * c.k + j, h);
      model.expert_bwd(c, in.idx[i * c.k + j], xr, dyr.data(), act.data(), dg.data(), du.data(), dx.data());
      for (int h = 0; h < H; ++h) want[h] += dx[h];
    }
    if (c.shared) {
      std::copy(in.dy.begin() + (size_t)i * H, in.dy.begin() + (size_t)(i + 1) * H, dyr.begin());
      model.expert_bwd(c, c.E(), xr, dyr.data(), act.data(), dg.data(), du.data(), dx.data());
      for (int h = 0; h < H; ++h) want[h] += dx[h];
      add_grads(El, xr);
    }
    for (int h = 0; h < H; ++h)
      EMU_CHECK(r.out[(size_t)i * H + h] == want[h], "ep=%d W=%d rank %d epoch %llu: token %d dx[%d] = %g, want %g",
                c.ep, c.W, rank, (unsigned long long)e, i, h, r.out[(size_t)i * H + h], want[h]);
  }
  for (int src = 0; src < c.ep; ++src) {
    const Inputs theirs(c, (int)e - 1, src);
    for (int p = 0; p < c.t * c.k; ++p) {
      const int ex = theirs.idx[p];
      if (ex / El != rank) continue;
      for (int h = 0; h < H; ++h) dyr[h] = theirs.dy_row(c, p, h);
      const float* xr = &theirs.x[(size_t)(p / c.k) * H];
      model.expert_bwd(c, ex, xr, dyr.data(), act.data(), dg.data(), du.data(), dx.data());
      add_grads(ex % El, xr);
    }
  }
  const size_t n = (size_t)(El + c.shared) * I * H;
  for (size_t i = 0; i < n; ++i)
    EMU_CHECK(r.dw2[i] == w2[i] && r.dw1g[i] == w1g[i] && r.dw1u[i] == w1u[i], "ep=%d W=%d rank %d epoch %llu: "
              "weight gradient %zu (expert %zu of %d local) dW2 %g want %g, dW1 gate %g want %g, up %g want %g",
              c.ep, c.W, rank, (unsigned long long)e, i, i / ((size_t)I * H), El, r.dw2[i], w2[i], r.dw1g[i],
              w1g[i], r.dw1u[i], w1u[i]);
}

// After a launch: exactly-once items and releases, and the output against a
// direct per-token computation.
void check_epoch(const Case& c, const Model& model, const Inputs& in, Rank& r, int rank, uint64_t e) {
  const MoeFwdShape s = c.shape(rank);
  const MoeLayout& L = *r.layout;
  const int nrb = moe_row_blocks(s, L), E = c.E();
  expect_once(r.ran[(int)MoeQueue::kFront], moe_n_front(s), "front item", c, rank, e);
  expect_once(r.ran[(int)MoeQueue::kMove], moe_n_move(s), "dispatch part", c, rank, e);
  const int builds = c.backward ? moe_n_bwd_build(s, L, MoeWgradTiles{c.I(), c.H()}) : moe_n_build(s, L);
  expect_once(r.ran[(int)MoeQueue::kBuild], builds, "GEMM tile", c, rank, e);
  expect_once(r.ran[(int)MoeQueue::kFold], moe_n_fold(s), "fold item", c, rank, e);
  EMU_CHECK(r.scans == 1, "rank %d epoch %llu: %u scans", rank, (unsigned long long)e, r.scans);
  auto rel = [&](MoeFlag f, int home, int i) {
    return r.released[(int)f][(size_t)home * r.flags[(int)f].size() + i];
  };
  for (MoeFlag f : {MoeFlag::kScanned, MoeFlag::kPlanned, MoeFlag::kLaidOut})
    EMU_CHECK(rel(f, rank, 0) == 1, "rank %d: %s released %u times", rank, moe_flag_name(f), rel(f, rank, 0));
  for (int d = 0; d < c.ep; ++d) {
    EMU_CHECK(rel(MoeFlag::kCounts, d, rank) == 1, "rank %d: counts to %d sent %u times", rank, d,
              rel(MoeFlag::kCounts, d, rank));
    for (int x = 0; x < c.e_local; ++x) {
      const int i = rank * c.e_local + x, row_n = moe_src(s, L, x, d + 1) - moe_src(s, L, x, d);
      EMU_CHECK(rel(MoeFlag::kArrived, d, i) == 1, "rank %d: arrived[%d] at %d released %u times", rank, i, d,
                rel(MoeFlag::kArrived, d, i));
      EMU_CHECK(rel(MoeFlag::kXArrived, d, i) == (s.x_parts ? 1u : 0u), "rank %d: x_arrived[%d] at %d released "
                "%u times", rank, i, d, rel(MoeFlag::kXArrived, d, i));
      EMU_CHECK(rel(MoeFlag::kReturned, d, i) == (row_n > 0 ? 1u : 0u), "rank %d: unit (x %d, dst %d) of %d rows "
                "returned %u times", rank, x, d, row_n, rel(MoeFlag::kReturned, d, i));
    }
  }
  for (int rb = 0; rb < (int)r.flags[(int)MoeFlag::kGemm1].size(); ++rb) {
    const bool used = rb < nrb || moe_shared_rb(s, rb);
    EMU_CHECK(rel(MoeFlag::kGemm1, rank, rb) == used && rel(MoeFlag::kGemm2, rank, rb) == used,
              "rank %d: row block %d released %u/%u times", rank, rb, rel(MoeFlag::kGemm1, rank, rb),
              rel(MoeFlag::kGemm2, rank, rb));
  }
  if (c.backward) return check_backward(c, model, in, r, rank, e);
  std::vector<float> act(c.I()), y(c.H()), want(c.H());
  for (int i = 0; i < c.t; ++i) {
    std::fill(want.begin(), want.end(), 0.f);
    for (int j = 0; j < c.k; ++j) {
      const int p = i * c.k + j;
      EMU_CHECK(in.idx[p] >= 0 && in.idx[p] < E, "bad expert");
      model.expert(c, in.idx[p], &in.x[(size_t)i * c.H()], act.data(), y.data());
      for (int m = 0; m < c.H(); ++m) want[m] += in.w[p] * y[m];
    }
    if (c.shared) {
      model.expert(c, c.E(), &in.x[(size_t)i * c.H()], act.data(), y.data());
      for (int m = 0; m < c.H(); ++m) want[m] += y[m];
    }
    for (int m = 0; m < c.H(); ++m)
      EMU_CHECK(r.out[(size_t)i * c.H() + m] == want[m], "ep=%d W=%d rank %d epoch %llu: token %d out[%d] = %g, "
                "want %g", c.ep, c.W, rank, (unsigned long long)e, i, m, r.out[(size_t)i * c.H() + m], want[m]);
  }
}

// One rank's launches, back to back; each launch starts its W CTAs in a random order.
void run_rank(const Case& c, const Model& model, Ranks& ranks, int rank, unsigned seed) {
  std::mt19937 rng(seed);
  const MoeFwdShape s = c.shape(rank);
  for (int it = 0; it < c.epochs; ++it) {
    Rank& r = *ranks[rank];
    const uint64_t e = load_acquire<Scope::kGpu>(&r.epoch) + 1;
    const Inputs in(c, it, rank);
    const int sizes[kQueues] = {moe_n_front(s), moe_n_move(s),
                                (moe_max_row_blocks(s) + s.shared_blocks) * (c.nt1 + c.nt2) +
                                    (c.e_local + 1) * (c.I() + c.H()),
                                0, moe_n_fold(s)};
    for (int q = 0; q < kQueues; ++q) r.ran[q].assign(sizes[q], 0);
    for (auto& v : r.released) std::fill(v.begin(), v.end(), 0u);
    r.scans = 0;
    std::vector<int> order(c.W);
    for (int i = 0; i < c.W; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    // Odd epochs with a builder to spare run a fixed crew (movers never build).
    const bool switching = it % 2 == 0 || c.movers >= c.W;
    std::vector<std::thread> ctas;
    for (int cta : order)
      ctas.emplace_back([&, cta] {
        HostOps ops{c, ranks, model, in, rank, cta, e, std::mt19937(seed * 7919u + cta * 31u + (unsigned)e), s};
        moe_fwd_cta(ops, s, cta, c.W, c.movers, switching);
      });
    for (auto& t : ctas) t.join();
    check_epoch(c, model, in, r, rank, e);
  }
}

}  // namespace

int main() {
  if (const char* ms = std::getenv("EMU_TIMEOUT_MS")) g_timeout_ns = std::strtoull(ms, nullptr, 10) * 1000000ull;
  const std::vector<Routing> all = {kBalanced, kHot, kSkewed, kOneRank, kBalanced};
  std::vector<Case> cases;
  // ep x W (one CTA per rank included), one mover, a few, or all; t = 13 tokens
  // in blocks of 4, k = 2 of 3 experts per rank, 4-row tiles, 2 dispatch groups,
  // capacity about twice the balanced mean, below t: balanced epochs mostly fit,
  // every token to the same experts overflows.
  for (int ep : {1, 2, 4, 8})
    for (int W : {1, 2, 5})
      for (int movers : {1, W == 5 ? 2 : W}) {
        if (movers == 1 && W == 2) continue;
        const int cap = std::min(12, (2 * 13 * 2 + 3 * ep - 1) / (3 * ep));
        cases.push_back({ep, W, movers, 13, 2, 4, 3, 4, 2, 3, 2, cap, 5, ep == 8 ? 5 : 20, all});
      }
  // Shapes: k = 1 (every token to one expert), one-row tiles, tiles wider than
  // any segment, more dispatch groups than blocks (empty parts), one group,
  // blocks larger than t, wide k, capacity 0 (always dropless) or t (never).
  cases.push_back({2, 3, 1, 11, 1, 3, 4, 2, 1, 2, 3, 2, 5, 20, {kHot, kBalanced, kSkewed, kOneRank, kHot}});
  cases.push_back({4, 2, 1, 9, 2, 2, 2, 1, 2, 2, 1, 3, 4, 10, all});
  cases.push_back({2, 4, 2, 10, 3, 4, 4, 16, 3, 2, 9, 4, 4, 20, all});
  cases.push_back({3, 3, 1, 7, 3, 20, 3, 3, 1, 1, 1, 0, 4, 20, all});
  cases.push_back({8, 2, 1, 8, 4, 3, 4, 4, 2, 4, 2, 8, 3, 5, all});
  cases.push_back({1, 4, 4, 17, 4, 5, 6, 4, 4, 3, 3, 17, 4, 20, all});
  cases.push_back({4, 2, 1, 13, 2, 4, 3, 4, 2, 3, 2, 13, 4, 10, all});  // capacity t: capped every epoch
  cases.push_back({8, 2, 2, 13, 2, 4, 3, 4, 2, 3, 2, 13, 3, 5, all});
  cases.push_back({2, 1, 1, 12, 2, 3, 3, 4, 2, 2, 2, 3, 8, 0, all});  // one CTA, no delays: tight interleavings
  cases.push_back({4, 3, 2, 12, 2, 3, 3, 4, 2, 2, 2, 3, 6, 0, all});
  // A shared expert: EP = 1 (the kernel's), one CTA, tiles across plan blocks,
  // t not a multiple of the tile, k = 1, and EP > 1.
  cases.push_back({1, 3, 1, 13, 2, 4, 3, 4, 2, 3, 2, 13, 5, 20, all, true});
  cases.push_back({1, 1, 1, 10, 1, 3, 4, 4, 2, 2, 2, 10, 4, 0, all, true});
  cases.push_back({1, 5, 2, 17, 3, 5, 6, 3, 3, 2, 3, 17, 4, 10, all, true});
  cases.push_back({2, 3, 1, 11, 2, 4, 3, 4, 2, 3, 2, 5, 4, 20, all, true});
  cases.push_back({4, 2, 1, 9, 2, 2, 2, 2, 2, 2, 1, 3, 4, 10, all, true});
  // At most one row block an expert (Llama 4 Maverick's shape: the shared
  // tiles spread among the routed ones) in most epochs, more when skewed.
  cases.push_back({1, 3, 2, 16, 1, 4, 8, 4, 3, 2, 2, 16, 5, 20, all, true});
  cases.push_back({2, 2, 1, 8, 1, 3, 4, 4, 2, 3, 2, 8, 5, 10, all, true});
  // Every case once more through the backward's build queue and work.
  for (size_t i = 0, n = cases.size(); i < n; ++i) {
    cases.push_back(cases[i]);
    cases.back().backward = true;
  }
  unsigned seed = 1;
  for (const Case& c : cases) {
    for (int r = 0; r < c.ep; ++r) EMU_CHECK(moe_fwd_shape_ok(c.shape(r)), "ep=%d: shape refused", c.ep);
    const Model model(c);
    Ranks ranks;
    for (int r = 0; r < c.ep; ++r) ranks.emplace_back(new Rank(c, c.shape(r)));
    std::vector<std::thread> drivers;
    for (int r = 0; r < c.ep; ++r)
      drivers.emplace_back(run_rank, std::cref(c), std::cref(model), std::ref(ranks), r, seed++);
    for (auto& d : drivers) d.join();
    for (int r = 0; r < c.ep; ++r)
      EMU_CHECK(ranks[r]->epoch == (uint64_t)c.epochs, "rank %d ended at epoch %llu", r,
                (unsigned long long)ranks[r]->epoch);
  }
  EMU_CHECK(g_dropless > 0 && g_capped > 0, "modes: %ld dropless, %ld capped rank-epochs", g_dropless, g_capped);
  EMU_CHECK(g_mixed > 0, "no rank-epoch spread the shared tiles among the routed ones");
  std::printf("%zu cases (%ld capped, %ld dropless, %ld mixed rank-epochs), %d failures\n", cases.size(), g_capped,
              g_dropless, g_mixed, emu::g_failures);
  return emu::g_failures ? 1 : 0;
}
