// CPU run of the MoE routing's selection kernel (kernels/moe/select.h, the
// functions kernels/moe/select.cuh calls), its 32 lanes emulated in lockstep
// and in a shuffled order each pass, the two warp reductions (largest key, then
// lowest offered id) done here. Driven by tests/test_host_moe_select.py, which
// compares the ids with the twin (moe_router.pick).
// Usage: moe_select_emu DIR. Reads DIR/cfg.txt ("t E k n_groups topk_groups
// has_bias"), DIR/score.bin (fp32 [t, E]) and DIR/bias.bin (fp32 [E], when
// has_bias); writes DIR/idx.bin (int32 [t, k]). Exit 0 and "0 failures" when
// its own checks pass.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "moe/select.h"

#include "emu_check.h"

using namespace kosmos::moe;

namespace {

constexpr int kLanes = 32;

template <typename T>
std::vector<T> read_bin(const std::string& path, size_t n) {
  std::vector<T> v(n);
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), (std::streamsize)(n * sizeof(T)));
  EMU_CHECK(f.gcount() == (std::streamsize)(n * sizeof(T)), "%s: expected %zu values", path.c_str(), n);
  return v;
}

// One pass over the lanes' candidates: the kernel's select_take, its reductions here.
template <int kN>
int take(const uint32_t (&key)[kLanes][kN], uint32_t (&avail)[kLanes], std::mt19937& rng) {
  std::vector<int> lanes(kLanes);
  std::iota(lanes.begin(), lanes.end(), 0);
  std::shuffle(lanes.begin(), lanes.end(), rng);
  uint32_t bk[kLanes], top = 0, id = 0xffffffffu;
  int bi[kLanes];
  for (int l : lanes) {
    select_lane_best(key[l], avail[l], &bk[l], &bi[l]);
    top = std::max(top, bk[l]);
  }
  for (int l : lanes) id = std::min(id, select_offer(bk[l], bi[l], top, l));
  for (int l : lanes) select_remove((int)id, l, &avail[l]);
  return (int)id;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  int t, E, k, G, TG, has_bias;
  std::ifstream cfg(dir + "/cfg.txt");
  cfg >> t >> E >> k >> G >> TG >> has_bias;
  const RouteConfig c{Score::kSoftmax, E, k, G, TG, false, 1.f, has_bias != 0};
  EMU_CHECK(route_config_ok(c), "not a routing rule: E=%d k=%d G=%d TG=%d", E, k, G, TG);
  const std::vector<float> score = read_bin<float>(dir + "/score.bin", (size_t)t * E);
  const std::vector<float> bias = has_bias ? read_bin<float>(dir + "/bias.bin", E) : std::vector<float>(1);
  std::vector<int> idx((size_t)t * k, -1);
  std::mt19937 rng(12345);
  std::vector<float> ch(E);
  for (int i = 0; i < t; ++i) {
    for (int e = 0; e < E; ++e) ch[e] = select_choice(score.data() + (size_t)i * E, bias.data(), c, e);
    uint64_t kept = ~0ull;
    if (G > 1) {
      uint32_t gk[kLanes][kSelectGroupsPerLane], gavail[kLanes];
      for (int l = 0; l < kLanes; ++l) select_group_keys(ch.data(), c, l, gk[l], &gavail[l]);
      kept = 0;
      for (int pass = 0; pass < TG; ++pass) kept |= 1ull << take(gk, gavail, rng);
    }
    uint32_t key[kLanes][kSelectPerLane], avail[kLanes];
    for (int l = 0; l < kLanes; ++l) select_expert_keys(ch.data(), c, kept, l, key[l], &avail[l]);
    for (int j = 0; j < k; ++j) {
      const int e = take(key, avail, rng);
      EMU_CHECK(e >= 0 && e < E, "token %d pass %d: id %d out of range", i, j, e);
      idx[(size_t)i * k + j] = e;
    }
  }
  std::ofstream out(dir + "/idx.bin", std::ios::binary);
  out.write(reinterpret_cast<const char*>(idx.data()), (std::streamsize)(idx.size() * sizeof(int)));
  std::printf("%d failures\n", emu::g_failures);
  return emu::g_failures == 0 ? 0 : 1;
}
