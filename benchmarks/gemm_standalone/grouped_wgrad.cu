// The MoE backward's grouped weight gradient (kernels/moe/grouped_bwd_sm90.cuh
// grouped_wgrad_launch: dW[e] = a[rows of e]^T @ b[rows of e], K = the
// expert's rows) on the cooperative schedule the library runs and on the
// pingpong one (kernels/gemm/sm90/tile_pingpong.cuh), which only this driver
// runs until it is measured to win. The check: the portable oracle expert by
// expert, fresh random inputs, empty experts (dW zeros: no k-block at all), a
// poisoned guarded output, two runs bitwise equal, both schedules the same
// bits, grids of one and two CTAs. The benchmark: every preset's wgrad1 and
// wgrad2 on balanced rows, both schedules.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engines.h"
#include "moe/grouped_bwd_sm90.cuh"
#include "util.cuh"

namespace bench {
namespace {

using kosmos::gemm::Layout;
using WgradCfg = kosmos::sm90::TileConfig<Layout::NT, 128, 256, 3>;  // the library's (csrc/moe_bwd_sm90.cu)
using WgradPingpongCfg = kosmos::sm90::TileConfig<Layout::NT, 128, 128, 4, true, true>;

// Experts' row-block bounds [E + 1] of `rows` real rows each, padded to 128.
std::vector<int> row_blocks(const std::vector<int>& rows) {
  std::vector<int> rb(1, 0);
  for (int r : rows) rb.push_back(rb.back() + (r + 127) / 128);
  return rb;
}

template <class Cfg>
Guarded run_wgrad(const __nv_bfloat16* a, const __nv_bfloat16* b, const int* rb, int R, int P, int Q, int E, int grid,
                  cudaStream_t s) {
  Guarded out;
  out.alloc((size_t)E * P * Q * 2);
  out.poison(s);
  CK(kosmos::moe::grouped_wgrad_launch<Cfg>(a, b, out.c(), rb, R, P, Q, E, grid, s));
  CK(cudaStreamSynchronize(s));
  return out;
}

struct WgradCase {
  std::vector<int> rows;  // real rows per expert (each padded to 128)
  int P, Q, grid;
};

bool check_wgrad(const WgradCase& wc, uint64_t seed, cudaStream_t s) {
  const int E = (int)wc.rows.size(), P = wc.P, Q = wc.Q;
  const std::vector<int> rb = row_blocks(wc.rows);
  const int R = rb[E] * 128;
  __nv_bfloat16 *a, *b;
  float* ref;
  int* drb;
  CK(cudaMalloc(&a, std::max<size_t>(1, (size_t)R * P) * 2));
  CK(cudaMalloc(&b, std::max<size_t>(1, (size_t)R * Q) * 2));
  CK(cudaMalloc(&ref, (size_t)E * P * Q * 4));
  CK(cudaMalloc(&drb, rb.size() * sizeof(int)));
  if (R) fill_random<<<1024, 256, 0, s>>>(a, (size_t)R * P, seed);
  if (R) fill_random<<<1024, 256, 0, s>>>(b, (size_t)R * Q, seed ^ 0x5bd1e995ull);
  CK(cudaMemcpyAsync(drb, rb.data(), rb.size() * sizeof(int), cudaMemcpyHostToDevice, s));
  CK(cudaMemsetAsync(ref, 0, (size_t)E * P * Q * 4, s));  // an expert without rows: dW = 0
  for (int e = 0; e < E; ++e)  // the oracle, one expert at a time over its padded rows (NT: A and B MN-major)
    if (rb[e + 1] > rb[e])
      CK(portable_f32(Layout::NT,
                      kosmos::gemm::Problem{a + (size_t)rb[e] * 128 * P, b + (size_t)rb[e] * 128 * Q,
                                            ref + (size_t)e * P * Q, P, Q, (rb[e + 1] - rb[e]) * 128},
                      0, s));
  std::vector<uint8_t> coop;
  bool pass = true;
  auto one = [&](auto run, const char* schedule) {
    Guarded out = run(a, b, drb, R, P, Q, E, wc.grid, s), again = run(a, b, drb, R, P, Q, E, wc.grid, s);
    const ErrSums err = rel_error((const __nv_bfloat16*)out.c(), ref, (size_t)E * P * Q, s);
    std::vector<uint8_t> x(out.bytes), y(again.bytes);
    CK(cudaMemcpy(x.data(), out.c(), out.bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y.data(), again.c(), again.bytes, cudaMemcpyDeviceToHost));
    const bool same = x == y, as_coop = coop.empty() || x == coop;
    const unsigned long long guard = out.guard_damage(s);
    // An all-empty case has a zero reference: then every element must be exactly zero.
    const double rel = err.ref2 > 0 ? std::sqrt(err.diff2 / err.ref2) : std::sqrt(err.diff2);
    const bool ok = err.nonfinite == 0 && guard == 0 && same && as_coop && rel < 1e-2 && std::isfinite(rel);
    printf("check wgrad NT %s E=%3d R=%6d P=%5d Q=%5d grid=%4d  rel=%.3e (tol 1e-02) unwritten=%llu guard=%llu "
           "deterministic=%d same-as-cooperative=%d  %s\n", schedule, E, R, P, Q, wc.grid, rel, err.nonfinite, guard,
           (int)same, (int)as_coop, ok ? "PASS" : "FAIL");
    fflush(stdout);
    if (coop.empty()) coop = std::move(x);
    out.free(); again.free();
    pass = pass && ok;
  };
  one(run_wgrad<WgradCfg>, "cooperative 128x256");
  one(run_wgrad<WgradPingpongCfg>, "pingpong 128x128   ");
  CK(cudaFree(a)); CK(cudaFree(b)); CK(cudaFree(ref)); CK(cudaFree(drb));
  return pass;
}

}  // namespace

int check_grouped_wgrad(cudaStream_t s) {
  uint64_t seed = 0x7f4au ^ (uint64_t)time(nullptr);
  const std::vector<WgradCase> cases = {
      {{300, 0, 128, 45}, 256, 776, 0},   // an empty expert: its dW tiles have no k-block
      {{512, 512, 512}, 768, 2048, 0},    // Qwen3-30B-A3B's wgrad2 shape (P = I, Q = H), 3 experts
      {{257, 0, 1000}, 384, 512, 1},      // one CTA: the groups alternate over tiles of 3, 0 and 8 k-blocks
      {{0, 130}, 128, 640, 2},            // tiles with and without k-blocks on two CTAs
      {{0, 0}, 256, 256, 0},              // no rows at all: every dW is zeros
  };
  int fails = 0;
  for (const auto& c : cases) fails += !check_wgrad(c, ++seed, s);
  printf("check wgrad: %zu cases, %d failed\n", cases.size(), fails);
  return fails;
}

// Both weight gradients of every preset's routed experts, t = 8192 tokens,
// balanced rows (t k / E per expert, padded to 128): wgrad1 dW1 [E, H, 2I] =
// x^T @ dh, wgrad2 dW2 [E, I, H] = h^T @ dy. Median of 20 calls after 3, CUDA
// events; the pingpong time over the cooperative one's in brackets.
int bench_grouped_wgrad(cudaStream_t s) {
  struct Preset {
    const char* name;
    int E, k, H, I;
  };
  const Preset presets[] = {{"Qwen3-30B-A3B", 128, 8, 2048, 768}, {"Qwen3-235B-A22B", 128, 8, 4096, 1536},
                            {"DeepSeek-V3", 256, 8, 7168, 2048}, {"Llama4-Scout", 16, 1, 5120, 8192}};
  const int t = 8192;
  auto time_wgrad = [&](int E, int per, int P, int Q, bool pingpong) {
    const std::vector<int> rb = row_blocks(std::vector<int>(E, per));
    const int R = rb[E] * 128;
    __nv_bfloat16 *a, *b, *c;
    int* drb;
    CK(cudaMalloc(&a, (size_t)R * P * 2)); CK(cudaMalloc(&b, (size_t)R * Q * 2)); CK(cudaMalloc(&c, (size_t)E * P * Q * 2));
    CK(cudaMalloc(&drb, rb.size() * sizeof(int)));
    CK(cudaMemcpy(drb, rb.data(), rb.size() * sizeof(int), cudaMemcpyHostToDevice));
    fill_random<<<1024, 256, 0, s>>>(a, (size_t)R * P, 21);
    fill_random<<<1024, 256, 0, s>>>(b, (size_t)R * Q, 22);
    auto call = [&] {
      if (pingpong) CK(kosmos::moe::grouped_wgrad_launch<WgradPingpongCfg>(a, b, c, drb, R, P, Q, E, 0, s));
      else CK(kosmos::moe::grouped_wgrad_launch<WgradCfg>(a, b, c, drb, R, P, Q, E, 0, s));
    };
    const double ms = median_ms(s, call);
    CK(cudaFree(a)); CK(cudaFree(b)); CK(cudaFree(c)); CK(cudaFree(drb));
    return ms;
  };
  printf("| preset | rows/expert | wgrad1 ms | wgrad1 pp ms | wgrad2 ms | wgrad2 pp ms | TFLOP/s | pp TFLOP/s |\n");
  printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Preset& p : presets) {
    const int per = t * p.k / p.E;
    const double w1 = time_wgrad(p.E, per, p.H, 2 * p.I, false), w1p = time_wgrad(p.E, per, p.H, 2 * p.I, true);
    const double w2 = time_wgrad(p.E, per, p.I, p.H, false), w2p = time_wgrad(p.E, per, p.I, p.H, true);
    const double flops = 2.0 * t * p.k * 3.0 * p.H * p.I;
    printf("| %s | %d | %.3f | %.3f (%.3f) | %.3f | %.3f (%.3f) | %.0f | %.0f |\n", p.name, per, w1, w1p, w1p / w1, w2,
           w2p, w2p / w2, flops / (w1 + w2) * 1e-9, flops / (w1p + w2p) * 1e-9);
    fflush(stdout);
  }
  return 0;
}

}  // namespace bench
