// Host model of the Hopper engine's pingpong consumers (kernels/gemm/sm90/
// tile_pingpong.cuh) with the engine's claimer and loading thread
// (tile_engine.cuh, tile_loads.cuh): one CTA's threads as host threads, each
// consumer warp group as one, with random delays. The device code is PTX
// (mbarriers, named barriers, wgmma) and cannot run here, so this models it
// step for step, with the hardware's semantics where the schedule's soundness
// rests on them:
//   - an mbarrier wait on parity P passes whenever the barrier's current phase
//     has the other parity, so a waiter two phases ahead passes falsely: the
//     model records which ring position each stage holds and fails on a pass
//     that finds another position there;
//   - a named barrier completes on its count of arrivals, whoever makes them,
//     so a group passing the turn twice before the other waits would let it
//     through out of order: the model counts arrivals the same way.
// Checks: every claimed tile computed once, by its group (claim j % 2); the
// tensor cores see the tiles' k-blocks strictly in claim order (mainloops take
// turns); no stage overwritten before its reader released it; no false parity
// pass; no deadlock (bounded waits), at 2-5 stages, 0-9 tiles a CTA, tiles of
// 0-4 k-blocks (a weight gradient's expert without rows has none).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "emu_check.h"

namespace {

using Clock = std::chrono::steady_clock;
std::atomic<bool> g_abort{false};  // a wait timed out: every thread leaves

bool timed_out(Clock::time_point t0, const char* who, const char* what) {
  if (g_abort.load()) return true;
  if (Clock::now() - t0 < std::chrono::seconds(2)) return false;
  EMU_CHECK(false, "deadlock: %s waiting for %s", who, what);
  g_abort = true;
  return true;
}

// An mbarrier: a phase completes when `count` arrivals are in.
struct MBar {
  std::mutex m;
  int count = 1, arrived = 0;
  std::atomic<uint32_t> completed{0};
  void arrive() {
    std::lock_guard<std::mutex> l(m);
    if (++arrived == count) arrived = 0, completed.fetch_add(1);
  }
  // try_wait.parity: passes while the current (incomplete) phase's parity differs from `parity`.
  bool wait(uint32_t parity, const char* who, const char* what) {
    const auto t0 = Clock::now();
    while ((completed.load() & 1u) == parity) {
      if (timed_out(t0, who, what)) return false;
      std::this_thread::yield();
    }
    return true;
  }
};

// A named barrier between the two groups (bar.arrive / bar.sync, 2 x 128 threads).
struct NamedBar {
  std::mutex m;
  int arrived = 0;
  uint64_t generation = 0;
  void arrive() {
    std::lock_guard<std::mutex> l(m);
    if (++arrived == 2) arrived = 0, ++generation;
  }
  bool sync(const char* who) {
    uint64_t g;
    {
      std::lock_guard<std::mutex> l(m);
      g = generation;
      if (++arrived == 2) {
        arrived = 0, ++generation;
        return true;
      }
    }
    const auto t0 = Clock::now();
    for (;;) {
      {
        std::lock_guard<std::mutex> l(m);
        if (generation != g) return true;
      }
      if (timed_out(t0, who, "its turn")) return false;
      std::this_thread::yield();
    }
  }
};

struct Ring {  // the engine's Ring (gemm/sm90/barrier.cuh), skip() included
  int slot = 0;
  uint32_t phase = 0;
  void advance(int n) {
    if (++slot == n) slot = 0, phase ^= 1;
  }
  void skip(int n, int count) {
    const int to = slot + count;
    slot = to % n;
    phase ^= uint32_t(to / n) & 1u;
  }
};

struct Cta {
  int stages;
  std::vector<int> kblocks;  // per claimed tile
  std::vector<MBar> full, empty;
  MBar claim_full[2], claim_empty[2];
  int claim[2] = {0, 0}, claim_valid[2] = {0, 0};
  NamedBar turn[2];
  std::vector<std::atomic<int>> held;      // the ring position each stage holds
  std::vector<std::atomic<int>> released;  // per ring position: its reader released it
  std::mutex log_m;
  std::vector<std::pair<int, int>> issued;  // (tile, k-block) in the order the tensor cores got them
  std::vector<std::atomic<int>> computed_by;
  uint64_t seed;

  Cta(int s, std::vector<int> kb, uint64_t sd)
      : stages(s), kblocks(std::move(kb)), full(s), empty(s), held(s), released(total()), computed_by(kblocks.size()),
        seed(sd) {
    for (auto& h : held) h = -1;
    for (auto& r : released) r = 0;
    for (auto& c : computed_by) c = -1;
    for (auto& e : empty) e.count = 1;  // one group reads a stage (its 4 warps arrive as one here)
    for (auto& c : claim_empty) c.count = 3;  // both groups and the loading thread
  }
  int total() const {
    int n = 0;
    for (int k : kblocks) n += k;
    return n;
  }
};

void nap(std::mt19937_64& rng) {
  const int r = int(rng() % 16);
  if (r < 10) return;
  if (r < 14) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40));
}

void claimer(Cta& c) {
  std::mt19937_64 rng(c.seed ^ 1);
  Ring mailbox;
  for (int j = 0;; ++j) {
    if (!c.claim_empty[mailbox.slot].wait(mailbox.phase ^ 1, "claimer", "a claim slot empty")) return;
    nap(rng);
    const bool ok = j < (int)c.kblocks.size();
    c.claim[mailbox.slot] = j, c.claim_valid[mailbox.slot] = ok;
    c.claim_full[mailbox.slot].arrive();
    if (!ok) return;
    mailbox.advance(2);
  }
}

void loader(Cta& c) {
  std::mt19937_64 rng(c.seed ^ 2);
  Ring stages, mailbox;
  int pos = 0;
  for (;;) {
    if (!c.claim_full[mailbox.slot].wait(mailbox.phase, "loader", "a claim")) return;
    const int t = c.claim[mailbox.slot];
    const bool ok = c.claim_valid[mailbox.slot] != 0;
    c.claim_empty[mailbox.slot].arrive();
    if (!ok) return;
    for (int k = 0; k < c.kblocks[t]; ++k, ++pos) {
      if (!c.empty[stages.slot].wait(stages.phase ^ 1, "loader", "a stage empty")) return;
      EMU_CHECK(pos < c.stages || c.released[pos - c.stages] == 1, "stage %d overwritten (position %d) before "
                "position %d was released", stages.slot, pos, pos - c.stages);
      nap(rng);
      c.held[stages.slot] = pos;
      c.full[stages.slot].arrive();  // the bytes landed
      stages.advance(c.stages);
    }
    mailbox.advance(2);
  }
}

// tile_pingpong.cuh's PingpongCompute::consume_all and compute_tile, step for step.
void group(Cta& c, int g) {
  std::mt19937_64 rng(c.seed ^ (16 + g));
  const char* who = g ? "group 1" : "group 0";
  Ring stages, mailbox;
  int pos = 0;
  for (int j = 0;; ++j) {
    if (!c.claim_full[mailbox.slot].wait(mailbox.phase, who, "a claim")) return;
    const int t = c.claim[mailbox.slot];
    const bool ok = c.claim_valid[mailbox.slot] != 0;
    c.claim_empty[mailbox.slot].arrive();
    mailbox.advance(2);
    if ((j & 1) != g) {
      if (!ok) break;
      stages.skip(c.stages, c.kblocks[t]);
      pos += c.kblocks[t];
      continue;
    }
    if (j > 0 && !c.turn[g].sync(who)) return;
    if (!ok) break;
    EMU_CHECK(t == j, "%s got claim %d for tile %d", who, j, t);
    const int kb = c.kblocks[t];
    int prev = -1, prev_pos = -1;
    for (int k = 0; k < kb; ++k, ++pos) {
      if (!c.full[stages.slot].wait(stages.phase, who, "a stage full")) return;
      EMU_CHECK(c.held[stages.slot] == pos, "%s passed the full wait of stage %d for position %d, which holds %d "
                "(a parity wait more than one phase ahead)", who, stages.slot, pos, c.held[stages.slot].load());
      {
        std::lock_guard<std::mutex> l(c.log_m);
        c.issued.emplace_back(t, k);
      }
      nap(rng);  // warpgroup_wait<1>: the previous batch completed
      if (prev >= 0) c.released[prev_pos] = 1, c.empty[prev].arrive();
      if (k == kb - 1) c.turn[g ^ 1].arrive();  // the last batch is issued: the other group's turn
      prev = stages.slot, prev_pos = pos;
      stages.advance(c.stages);
    }
    nap(rng);  // warpgroup_wait<0>
    if (prev >= 0) c.released[prev_pos] = 1, c.empty[prev].arrive();
    if (kb == 0) c.turn[g ^ 1].arrive();
    EMU_CHECK(c.computed_by[t] == -1, "tile %d computed twice", t);
    c.computed_by[t] = g;
    nap(rng);  // the epilogue, under the other group's mainloop
  }
}

void run_cta(int stages, const std::vector<int>& kblocks, uint64_t seed) {
  Cta c(stages, kblocks, seed);
  g_abort = false;
  std::thread th[4] = {std::thread(claimer, std::ref(c)), std::thread(loader, std::ref(c)),
                       std::thread(group, std::ref(c), 0), std::thread(group, std::ref(c), 1)};
  for (auto& x : th) x.join();
  if (g_abort) {
    std::printf("  (stages=%d tiles=%zu seed=%llu)\n", stages, kblocks.size(), (unsigned long long)seed);
    return;
  }
  std::vector<std::pair<int, int>> want;
  for (int t = 0; t < (int)kblocks.size(); ++t) {
    EMU_CHECK(c.computed_by[t] == t % 2, "tile %d computed by %d, not group %d", t, c.computed_by[t].load(), t % 2);
    for (int k = 0; k < kblocks[t]; ++k) want.emplace_back(t, k);
  }
  EMU_CHECK(c.issued == want, "the tensor cores got k-blocks out of claim order (stages=%d tiles=%zu seed=%llu)",
            stages, kblocks.size(), (unsigned long long)seed);
  for (int p = 0; p < c.total(); ++p) EMU_CHECK(c.released[p] == 1, "position %d never released", p);
}

}  // namespace

int main() {
  // Ring::skip(n, count) is `count` advances.
  for (int n = 1; n <= 5; ++n)
    for (int s0 = 0; s0 < n; ++s0)
      for (int count = 0; count <= 13; ++count) {
        Ring a{s0, 1}, b{s0, 1};
        a.skip(n, count);
        for (int i = 0; i < count; ++i) b.advance(n);
        EMU_CHECK(a.slot == b.slot && a.phase == b.phase, "skip(%d, %d) from slot %d", n, count, s0);
      }
  std::mt19937_64 rng(20261205);
  int runs = 0;
  for (int stages : {2, 3, 5})
    for (int tiles = 0; tiles <= 9; ++tiles)
      for (int rep = 0; rep < 6; ++rep) {
        std::vector<int> kb(tiles);
        for (int& k : kb) k = int(rng() % 5);  // 0..4 k-blocks, fewer and more than the stages
        run_cta(stages, kb, rng());
        ++runs;
      }
  std::printf("pingpong model: %d CTA runs, %d failures\n", runs, emu::g_failures);
  return emu::g_failures == 0 ? 0 : 1;
}
