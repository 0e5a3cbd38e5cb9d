// CPU run of the MoE forward's route and plan stages (kernels/moe/route.h,
// kernels/moe/plan.h), driven by tests/test_host_moe_route_plan.py, which
// compares what this writes with the pure-JAX twin.
// Route: token blocks of `route_block` tokens routed in a shuffled block order,
// every other token scored in place (logits and score aliased), aux partials
// added by 3 lanes taken in reverse order, then summed in block order; done
// twice with different shuffles, and prob_sum must be bitwise equal.
// Plan: for each block size given, (a) and (c) over the blocks in a shuffled
// order, (b) by 5 lanes in a shuffled order; pos must not depend on the block
// size (checked here and by the test).
// Usage: moe_route_plan_emu DIR. Reads DIR/cfg.txt ("key value" lines),
// DIR/logits.bin (fp32 [t, E]) and DIR/bias.bin (fp32 [E], when has_bias).
// Writes int32/fp32 little-endian files: indices [t, k], weights [t, k],
// prob_sum [E], and per block size B: counts_B [E], pos_B [t, k], start1_B and
// start128_B [E + 1], order_B [start128[E]] (-1 on padding rows), overflow_B
// [len(caps)]. Exit 0 and "0 failures" when its own checks pass.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "moe/plan.h"
#include "moe/route.h"

#include "emu_check.h"

using namespace kosmos::moe;

namespace {

std::string g_dir;

template <typename T>
std::vector<T> read_bin(const std::string& name, size_t n) {
  std::vector<T> v(n);
  std::ifstream f(g_dir + "/" + name, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), (std::streamsize)(n * sizeof(T)));
  EMU_CHECK(f.gcount() == (std::streamsize)(n * sizeof(T)), "%s: expected %zu values", name.c_str(), n);
  return v;
}

template <typename T>
void write_bin(const std::string& name, const std::vector<T>& v) {
  std::ofstream f(g_dir + "/" + name, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), (std::streamsize)(v.size() * sizeof(T)));
}

// "key v0 v1 ..." lines.
std::map<std::string, std::vector<double>> read_cfg() {
  std::map<std::string, std::vector<double>> cfg;
  std::ifstream f(g_dir + "/cfg.txt");
  std::string line, key;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    in >> key;
    for (double v; in >> v;) cfg[key].push_back(v);
  }
  return cfg;
}

std::vector<int> shuffled(int n, std::mt19937& rng) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

struct Routed {
  std::vector<int> idx;        // [t, k]
  std::vector<float> w;        // [t, k]
  std::vector<float> prob_sum;  // [E]
};

// Blocks in a shuffled order, as CTAs would take them; partials[n_blocks, E].
Routed route_all(const std::vector<float>& logits, const float* bias, const RouteConfig& c, int t,
                 int route_block, std::mt19937& rng) {
  const int E = c.num_experts, k = c.top_k;
  const int n_blocks = (t + route_block - 1) / route_block;
  constexpr int kLanes = 3;
  Routed r{std::vector<int>((size_t)t * k), std::vector<float>((size_t)t * k), std::vector<float>(E)};
  std::vector<float> partials((size_t)n_blocks * E), scratch(E), partial(E);
  for (int b : shuffled(n_blocks, rng)) {
    std::fill(partial.begin(), partial.end(), 0.f);
    for (int i = b * route_block; i < std::min(t, (b + 1) * route_block); ++i) {
      const float* row = logits.data() + (size_t)i * E;
      const float* in = row;
      if (i % 2) {  // score in place
        std::copy(row, row + E, scratch.begin());
        in = scratch.data();
      }
      const float norm = route_token(in, scratch.data(), bias, c, &r.idx[(size_t)i * k], &r.w[(size_t)i * k]);
      for (int lane = kLanes - 1; lane >= 0; --lane) add_aux_probs(scratch.data(), norm, E, partial.data(), lane, kLanes);
    }
    std::copy(partial.begin(), partial.end(), partials.begin() + (size_t)b * E);
  }
  for (int lane = 0; lane < kLanes; ++lane) sum_partials(partials.data(), n_blocks, E, r.prob_sum.data(), lane, kLanes);
  return r;
}

// The three plan steps for block size B, then the segments and the overflow test.
std::vector<int> plan_all(const std::vector<int>& idx, int t, int k, int E, int B, const std::vector<int>& caps,
                          std::mt19937& rng) {
  const PlanShape s{t, k, B, E};
  const int n_blocks = plan_blocks(s);
  std::vector<int> hist((size_t)n_blocks * E, -7), counts(E), pos((size_t)t * k, -1);
  for (int b : shuffled(n_blocks, rng)) plan_histogram(idx.data(), s, b, hist.data() + (size_t)b * E);
  constexpr int kLanes = 5;
  for (int lane : shuffled(kLanes, rng)) plan_scan(hist.data(), s, counts.data(), lane, kLanes);
  std::vector<int> start1(E + 1), start128(E + 1);
  const int packed = plan_segments<1>(counts.data(), E, start1.data());
  const int padded = plan_segments<128>(counts.data(), E, start128.data());
  EMU_CHECK(packed == t * k, "B=%d: packed rows %d != t*k = %d", B, packed, t * k);
  std::vector<int> order(padded, -1);
  for (int b : shuffled(n_blocks, rng))
    plan_scatter(idx.data(), s, b, hist.data() + (size_t)b * E, start128.data(), pos.data(), order.data());
  std::vector<int> over;
  for (int cap : caps) over.push_back(plan_overflow(counts.data(), E, cap) ? 1 : 0);
  const std::string tag = "_" + std::to_string(B) + ".bin";
  write_bin("counts" + tag, counts);
  write_bin("pos" + tag, pos);
  write_bin("start1" + tag, start1);
  write_bin("start128" + tag, start128);
  write_bin("order" + tag, order);
  write_bin("overflow" + tag, over);
  return pos;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  g_dir = argv[1];
  auto cfg = read_cfg();
  auto one = [&](const char* key) { return cfg[key].at(0); };
  const RouteConfig c{one("score") ? Score::kSigmoid : Score::kSoftmax, (int)one("E"), (int)one("k"),
                      (int)one("G"), (int)one("TG"), one("norm") != 0, (float)one("scale"), one("has_bias") != 0};
  if (!route_config_ok(c)) {
    std::printf("route config refused\n");
    return 2;
  }
  const int t = (int)one("t"), E = c.num_experts, k = c.top_k;
  std::mt19937 rng((unsigned)one("seed"));
  const auto logits = read_bin<float>("logits.bin", (size_t)t * E);
  const auto bias = c.has_bias ? read_bin<float>("bias.bin", E) : std::vector<float>();
  const Routed r = route_all(logits, bias.data(), c, t, (int)one("route_block"), rng);
  const Routed again = route_all(logits, bias.data(), c, t, (int)one("route_block"), rng);
  EMU_CHECK(r.idx == again.idx && r.w == again.w, "routing differs between block orders");
  EMU_CHECK(std::memcmp(r.prob_sum.data(), again.prob_sum.data(), E * sizeof(float)) == 0,
            "prob_sum not bitwise equal between block orders");
  write_bin("indices.bin", r.idx);
  write_bin("weights.bin", r.w);
  write_bin("prob_sum.bin", r.prob_sum);
  std::vector<int> caps;
  for (double v : cfg["caps"]) caps.push_back((int)v);
  std::vector<int> first_pos;
  for (double B : cfg["blocks"]) {
    const std::vector<int> pos = plan_all(r.idx, t, k, E, (int)B, caps, rng);
    if (first_pos.empty()) first_pos = pos;
    EMU_CHECK(pos == first_pos, "pos with B=%d differs from B=%d", (int)B, (int)cfg["blocks"][0]);
  }
  std::printf("%d failures\n", emu::g_failures);
  return emu::g_failures ? 1 : 0;
}
