// The MoE backward's grouped GEMMs (kernels/moe/grouped_bwd_sm90.cuh): the
// dgrad (grouped_dgrad_launch: C = A @ B[e]^T, dgrad1's dX rows = dh1 @ W1^T)
// and the weight gradient (grouped_wgrad_launch: dW[e] = a[rows of e]^T @
// b[rows of e], K = the expert's rows), on the library's configurations. The
// checks: the portable oracle expert by expert, fresh random inputs, empty
// experts (a wgrad's dW zeros: no k-block at all), poisoned guarded outputs,
// two runs bitwise equal, grids of one and two CTAs. The benchmark: every
// preset's dgrad1, dgrad2 (without its SwiGLU backward), wgrad1 and wgrad2 on
// balanced rows.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engines.h"
#include "moe/grouped_bwd_sm90.cuh"
#include "util.cuh"

namespace bench {
namespace {

using kosmos::gemm::Layout;
using DgradCfg = kosmos::sm90::TileConfig<Layout::NN, 128, 256, 3>;  // the library's (csrc/moe_bwd_sm90.cu)
using WgradCfg = kosmos::sm90::TileConfig<Layout::NT, 128, 256, 3>;  // the library's

// Experts' row-block bounds [E + 1] of `rows` real rows each, padded to 128.
std::vector<int> row_blocks(const std::vector<int>& rows) {
  std::vector<int> rb(1, 0);
  for (int r : rows) rb.push_back(rb.back() + (r + 127) / 128);
  return rb;
}

Guarded run_wgrad(const __nv_bfloat16* a, const __nv_bfloat16* b, const int* rb, int R, int P, int Q, int E, int grid,
                  cudaStream_t s) {
  return poisoned_run((size_t)E * P * Q * 2, s, [&](void* c) {
    return kosmos::moe::grouped_wgrad_launch<WgradCfg>(a, b, c, rb, R, P, Q, E, grid, s);
  });
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
  char label[160];
  snprintf(label, sizeof label, "wgrad NT 128x256 E=%3d R=%6d P=%5d Q=%5d grid=%4d", E, R, P, Q, wc.grid);
  const bool pass = check_grouped_output([&] { return run_wgrad(a, b, drb, R, P, Q, E, wc.grid, s); }, ref,
                                         (size_t)E * P * Q, label, s);
  CK(cudaFree(a)); CK(cudaFree(b)); CK(cudaFree(ref)); CK(cudaFree(drb));
  return pass;
}


Guarded run_dgrad(const __nv_bfloat16* a, const __nv_bfloat16* b, const int* te, int M, int N, int K, int E, int grid,
                  cudaStream_t s) {
  return poisoned_run((size_t)M * N * 2, s, [&](void* c) {
    return kosmos::moe::grouped_dgrad_launch<DgradCfg>(a, b, c, te, M, N, K, E, grid, s);
  });
}

struct DgradCase {
  std::vector<int> rows;  // real rows per expert (each padded to 128)
  int N, K, grid;
};

// c [M, N] = a [M, K] @ b[e]^T, b [E, N, K], against the oracle expert by expert (NN: both K-major).
bool check_dgrad(const DgradCase& dc, uint64_t seed, cudaStream_t s) {
  const int E = (int)dc.rows.size(), N = dc.N, K = dc.K;
  const std::vector<int> rb = row_blocks(dc.rows);
  const int M = rb[E] * 128;
  std::vector<int> tile_expert;
  for (int e = 0; e < E; ++e) tile_expert.insert(tile_expert.end(), rb[e + 1] - rb[e], e);
  __nv_bfloat16 *a, *b;
  float* ref;
  int* te;
  CK(cudaMalloc(&a, std::max<size_t>(1, (size_t)M * K) * 2));
  CK(cudaMalloc(&b, (size_t)E * N * K * 2));
  CK(cudaMalloc(&ref, std::max<size_t>(1, (size_t)M * N) * 4));
  CK(cudaMalloc(&te, std::max<size_t>(1, tile_expert.size()) * sizeof(int)));
  if (M) fill_random<<<1024, 256, 0, s>>>(a, (size_t)M * K, seed);
  fill_random<<<1024, 256, 0, s>>>(b, (size_t)E * N * K, seed ^ 0x5bd1e995ull);
  CK(cudaMemcpyAsync(te, tile_expert.data(), tile_expert.size() * sizeof(int), cudaMemcpyHostToDevice, s));
  for (int e = 0; e < E; ++e)
    if (rb[e + 1] > rb[e])
      CK(portable_f32(Layout::NN,
                      kosmos::gemm::Problem{a + (size_t)rb[e] * 128 * K, b + (size_t)e * N * K, ref + (size_t)rb[e] * 128 * N,
                                            (rb[e + 1] - rb[e]) * 128, N, K},
                      0, s));
  char label[160];
  snprintf(label, sizeof label, "dgrad NN 128x256 E=%3d M=%6d N=%5d K=%5d grid=%4d", E, M, N, K, dc.grid);
  const bool pass =
      check_grouped_output([&] { return run_dgrad(a, b, te, M, N, K, E, dc.grid, s); }, ref, (size_t)M * N, label, s);
  CK(cudaFree(a)); CK(cudaFree(b)); CK(cudaFree(ref)); CK(cudaFree(te));
  return pass;
}

}  // namespace

int check_grouped_bwd(cudaStream_t s) {
  uint64_t seed = 0x7f4au ^ (uint64_t)time(nullptr);
  const std::vector<DgradCase> dgrads = {
      {{300, 0, 128, 45}, 776, 512, 0},  // an empty expert
      {{512, 512}, 2048, 1536, 0},       // Qwen3-30B-A3B's dgrad1 shape (N = H, K = 2I), 2 experts
      {{257, 0, 300}, 384, 640, 1},      // one CTA does every tile
  };
  const std::vector<WgradCase> cases = {
      {{300, 0, 128, 45}, 256, 776, 0},   // an empty expert: its dW tiles have no k-block
      {{512, 512, 512}, 768, 2048, 0},    // Qwen3-30B-A3B's wgrad2 shape (P = I, Q = H), 3 experts
      {{257, 0, 1000}, 384, 512, 1},      // one CTA: tiles of 3, 0 and 8 k-blocks
      {{0, 130}, 128, 640, 2},            // tiles with and without k-blocks on two CTAs
      {{0, 0}, 256, 256, 0},              // no rows at all: every dW is zeros
  };
  int fails = 0;
  for (const auto& c : dgrads) fails += !check_dgrad(c, ++seed, s);
  for (const auto& c : cases) fails += !check_wgrad(c, ++seed, s);
  printf("check grouped backward: %zu cases, %d failed\n", dgrads.size() + cases.size(), fails);
  return fails;
}

// The backward's expert GEMMs of every preset's routed experts, t = 8192
// tokens, balanced rows (t k / E per expert, padded to 128): dgrad2 da [R, I] =
// dY @ W2[e]^T (K = H, its SwiGLU backward not included), dgrad1 dX [R, H] =
// dh [R, 2I] @ W1[e]^T (K = 2I), wgrad1 dW1 [E, H, 2I] = x^T @ dh and wgrad2 dW2
// [E, I, H] = h^T @ dY (K = the expert's rows). Median of 20 calls after 3, CUDA
// events.
int bench_grouped_bwd(cudaStream_t s) {
  struct Preset {
    const char* name;
    int E, k, H, I;
  };
  const Preset presets[] = {{"Qwen3-30B-A3B", 128, 8, 2048, 768}, {"Qwen3-235B-A22B", 128, 8, 4096, 1536},
                            {"DeepSeek-V3", 256, 8, 7168, 2048}, {"Llama4-Scout", 16, 1, 5120, 8192}};
  const int t = 8192;
  // c [R, N] = a [R, K] @ b[e]^T, b [E, N, K]
  auto time_dgrad = [&](int E, int per, int N, int K) {
    const std::vector<int> rb = row_blocks(std::vector<int>(E, per));
    const int M = rb[E] * 128;
    std::vector<int> tile_expert;
    for (int e = 0; e < E; ++e) tile_expert.insert(tile_expert.end(), rb[e + 1] - rb[e], e);
    __nv_bfloat16 *a, *b, *c;
    int* te;
    CK(cudaMalloc(&a, (size_t)M * K * 2)); CK(cudaMalloc(&b, (size_t)E * N * K * 2)); CK(cudaMalloc(&c, (size_t)M * N * 2));
    CK(cudaMalloc(&te, tile_expert.size() * sizeof(int)));
    CK(cudaMemcpy(te, tile_expert.data(), tile_expert.size() * sizeof(int), cudaMemcpyHostToDevice));
    fill_random<<<1024, 256, 0, s>>>(a, (size_t)M * K, 23);
    fill_random<<<1024, 256, 0, s>>>(b, (size_t)E * N * K, 24);
    auto call = [&] { CK(kosmos::moe::grouped_dgrad_launch<DgradCfg>(a, b, c, te, M, N, K, E, 0, s)); };
    const double ms = median_ms(s, call);
    CK(cudaFree(a)); CK(cudaFree(b)); CK(cudaFree(c)); CK(cudaFree(te));
    return ms;
  };
  // c [E, P, Q], c[e] = a[rows of e]^T @ b[rows of e]
  auto time_wgrad = [&](int E, int per, int P, int Q) {
    const std::vector<int> rb = row_blocks(std::vector<int>(E, per));
    const int R = rb[E] * 128;
    __nv_bfloat16 *a, *b, *c;
    int* drb;
    CK(cudaMalloc(&a, (size_t)R * P * 2)); CK(cudaMalloc(&b, (size_t)R * Q * 2)); CK(cudaMalloc(&c, (size_t)E * P * Q * 2));
    CK(cudaMalloc(&drb, rb.size() * sizeof(int)));
    CK(cudaMemcpy(drb, rb.data(), rb.size() * sizeof(int), cudaMemcpyHostToDevice));
    fill_random<<<1024, 256, 0, s>>>(a, (size_t)R * P, 21);
    fill_random<<<1024, 256, 0, s>>>(b, (size_t)R * Q, 22);
    auto call = [&] { CK(kosmos::moe::grouped_wgrad_launch<WgradCfg>(a, b, c, drb, R, P, Q, E, 0, s)); };
    const double ms = median_ms(s, call);
    CK(cudaFree(a)); CK(cudaFree(b)); CK(cudaFree(c)); CK(cudaFree(drb));
    return ms;
  };
  printf("| preset | rows/expert | dgrad2 ms | dgrad1 ms | wgrad1 ms | wgrad2 ms | TFLOP/s |\n");
  printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Preset& p : presets) {
    const int per = t * p.k / p.E;
    const double ms[4] = {time_dgrad(p.E, per, p.I, p.H), time_dgrad(p.E, per, p.H, 2 * p.I),
                          time_wgrad(p.E, per, p.H, 2 * p.I), time_wgrad(p.E, per, p.I, p.H)};
    // dgrad2 (t k H I, without the SwiGLU backward) + dgrad1 (2 t k H I) + both wgrads (3 t k H I), times 2
    const double flops = 2.0 * t * p.k * 6.0 * p.H * p.I;
    printf("| %s | %d | %.3f | %.3f | %.3f | %.3f | %.0f |\n", p.name, per, ms[0], ms[1], ms[2], ms[3],
           flops / (ms[0] + ms[1] + ms[2] + ms[3]) * 1e-9);
    fflush(stdout);
  }
  return 0;
}

}  // namespace bench
