// The MoE expert GEMMs (kernels/moe/grouped_gemm_sm90.cuh) against the portable
// oracle run expert by expert: fresh random inputs, ragged expert segments
// (empty ones too) padded to 128 rows, a poisoned guarded output, two runs
// bitwise equal, a grid of one CTA.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engines.h"
#include "moe/grouped_gemm_sm90.cuh"
#include "util.cuh"

namespace bench {
namespace {

using GroupedCfg = kosmos::sm90::TileConfig<kosmos::gemm::Layout::TN, 128, 256, 3>;  // ops.matmul's 128x256

struct GroupedCase {
  std::vector<int> rows;  // real rows per expert (each padded to 128)
  int N, K, grid;
};

Guarded run_grouped(const __nv_bfloat16* a, const __nv_bfloat16* b, const int* tile_expert, int M, int N, int K, int E,
                    int grid, cudaStream_t s) {
  Guarded out;
  out.alloc((size_t)M * N * 2);
  out.poison(s);
  CK(kosmos::moe::grouped_gemm_launch<GroupedCfg>(a, b, out.c(), tile_expert, M, N, K, E, grid, s));
  CK(cudaStreamSynchronize(s));
  return out;
}

bool check_one(const GroupedCase& gc, uint64_t seed, cudaStream_t s) {
  const int E = (int)gc.rows.size(), N = gc.N, K = gc.K;
  std::vector<int> start(E + 1, 0), tile_expert;
  for (int e = 0; e < E; ++e) {
    const int padded = (gc.rows[e] + 127) / 128 * 128;
    start[e + 1] = start[e] + padded;
    tile_expert.insert(tile_expert.end(), padded / 128, e);
  }
  const int M = start[E];
  __nv_bfloat16 *a, *b;
  float* ref;
  int* te;
  CK(cudaMalloc(&a, std::max<size_t>(1, (size_t)M * K) * 2));
  CK(cudaMalloc(&b, (size_t)E * K * N * 2));
  CK(cudaMalloc(&ref, std::max<size_t>(1, (size_t)M * N) * 4));
  CK(cudaMalloc(&te, std::max<size_t>(1, tile_expert.size()) * sizeof(int)));
  if (M) fill_random<<<1024, 256, 0, s>>>(a, (size_t)M * K, seed);
  fill_random<<<1024, 256, 0, s>>>(b, (size_t)E * K * N, seed ^ 0x5bd1e995ull);
  CK(cudaMemcpyAsync(te, tile_expert.data(), tile_expert.size() * sizeof(int), cudaMemcpyHostToDevice, s));
  CK(cudaMemsetAsync(ref, 0xFF, std::max<size_t>(1, (size_t)M * N) * 4, s));
  for (int e = 0; e < E; ++e)  // the oracle, one expert at a time over its padded rows
    if (start[e + 1] > start[e])
      CK(portable_f32(kosmos::gemm::Layout::TN,
                      kosmos::gemm::Problem{a + (size_t)start[e] * K, b + (size_t)e * K * N, ref + (size_t)start[e] * N,
                                            start[e + 1] - start[e], N, K},
                      0, s));
  Guarded out = run_grouped(a, b, te, M, N, K, E, gc.grid, s), again = run_grouped(a, b, te, M, N, K, E, gc.grid, s);
  const ErrSums err = rel_error((const __nv_bfloat16*)out.c(), ref, (size_t)M * N, s);
  std::vector<uint8_t> x(out.bytes), y(again.bytes);
  CK(cudaMemcpy(x.data(), out.c(), out.bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(y.data(), again.c(), again.bytes, cudaMemcpyDeviceToHost));
  const bool same = x == y;
  const unsigned long long guard = out.guard_damage(s);
  const double rel = M ? std::sqrt(err.diff2 / err.ref2) : 0.0;
  const bool pass = err.nonfinite == 0 && guard == 0 && same && rel < 1e-2 && std::isfinite(rel);
  printf("check grouped TN 128x256 E=%3d M=%6d N=%5d K=%5d grid=%4d  rel=%.3e (tol 1e-02) unwritten=%llu guard=%llu "
         "deterministic=%d  %s\n", E, M, N, K, gc.grid, rel, err.nonfinite, guard, (int)same, pass ? "PASS" : "FAIL");
  fflush(stdout);
  out.free(); again.free();
  CK(cudaFree(a)); CK(cudaFree(b)); CK(cudaFree(ref)); CK(cudaFree(te));
  return pass;
}

}  // namespace

int check_grouped(cudaStream_t s) {
  uint64_t seed = 0x9e37u ^ (uint64_t)time(nullptr);
  std::vector<int> ragged(8);
  for (int e = 0; e < 8; ++e) ragged[e] = (int)((seed >> (4 * e)) % 5) * 97;  // 0..388 rows, some experts empty
  const std::vector<GroupedCase> cases = {
      {{300, 0, 128, 45}, 776, 512, 0},
      {ragged, 1024, 1024, 0},
      {{1000}, 2048, 256, 0},
      {{257, 513, 0, 64}, 512, 2048, 1},        // one CTA does every tile
      {{0, 0, 0}, 256, 128, 0},                 // no rows at all: nothing to do
      {{640, 640, 640, 640}, 1536, 768, 0},     // balanced, Qwen3-30B-A3B's I = 768 as K
  };
  int fails = 0;
  for (const auto& c : cases) fails += !check_one(c, ++seed, s);
  printf("check grouped: %zu cases, %d failed\n", cases.size(), fails);
  return fails;
}

}  // namespace bench
