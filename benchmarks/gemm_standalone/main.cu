// Standalone driver for the tile engines: `check` verifies the Hopper engine
// against the portable oracle (and the oracle against cuBLAS) on fresh random
// inputs, poisoned outputs with guard zones and sizes that are not multiples
// of the tile, and the MoE expert GEMMs (grouped.cu, grouped_bwd.cu); `bench FILE [all-tiles]` times it against
// cuBLAS on the shapes in FILE (lines "name layout M N K", engine terms: C[M,N], contraction K);
// `bench-grouped` times the MoE expert GEMMs on the presets (the MoE floor) and the
// backward's dgrads and weight gradients.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engines.h"
#include "util.cuh"

using kosmos::gemm::Layout;
using kosmos::gemm::Problem;

namespace bench {

const char* layout_name(Layout l) { return l == Layout::TN ? "TN" : l == Layout::NN ? "NN" : "NT"; }

// C = A.B in cuBLAS's column-major terms: row-major C[M,N] is C^T, so
// C^T = B' . A' with each operand's transpose picked by its major.
cublasStatus_t cublas_gemm(cublasHandle_t h, Layout l, const Problem& p, cudaDataType ct) {
  const float one = 1.f, zero = 0.f;
  const auto bf = CUDA_R_16BF;
  const auto opb = l == Layout::NN ? CUBLAS_OP_T : CUBLAS_OP_N;
  const auto opa = l == Layout::NT ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ldb = l == Layout::NN ? p.K : p.N;
  const int lda = l == Layout::NT ? p.M : p.K;
  return cublasGemmEx(h, opb, opa, p.N, p.M, p.K, &one, p.b, bf, ldb, p.a, bf, lda, &zero, p.c, ct, p.N,
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

struct Inputs {
  __nv_bfloat16 *a = nullptr, *b = nullptr;
  void alloc(const Problem& p, uint64_t seed, cudaStream_t s) {
    const size_t na = (size_t)p.M * p.K, nb = (size_t)p.N * p.K;
    CK(cudaMalloc(&a, na * 2)); CK(cudaMalloc(&b, nb * 2));
    fill_random<<<1024, 256, 0, s>>>(a, na, seed);
    fill_random<<<1024, 256, 0, s>>>(b, nb, seed ^ 0x5bd1e995ull);
    CK(cudaGetLastError());
  }
  void free() { CK(cudaFree(a)); CK(cudaFree(b)); }
};

struct CheckCase {
  Layout l;
  int M, N, K;
  Tile tile;
  bool f32;
  int grid;            // <= 0: one CTA per SM
  int head_rows = 0;   // > 0: a head launch of `tile` over these rows, then a tail launch of `tail`
  Tile tail = Tile::k128x128;
};

// Runs the Hopper engine into a poisoned guarded buffer; returns its output.
Guarded run_sm90(const CheckCase& cc, const Inputs& in, cudaStream_t s) {
  Guarded out;
  out.alloc((size_t)cc.M * cc.N * (cc.f32 ? 4 : 2));
  out.poison(s);
  const Problem p{in.a, in.b, out.c(), cc.M, cc.N, cc.K};
  if (cc.head_rows > 0)
    CK(sm90_plan(cc.l, kosmos::sm90::Plan{cc.tile, cc.tail, cc.head_rows}, p, cc.grid, s));
  else
    CK(sm90(cc.l, cc.tile, cc.f32, p, cc.grid, s));
  CK(cudaStreamSynchronize(s));
  return out;
}

bool bitwise_equal(const Guarded& x, const Guarded& y) {
  std::vector<uint8_t> hx(x.bytes), hy(y.bytes);
  CK(cudaMemcpy(hx.data(), x.c(), x.bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hy.data(), y.c(), y.bytes, cudaMemcpyDeviceToHost));
  return std::memcmp(hx.data(), hy.data(), x.bytes) == 0;
}

bool run_check(const CheckCase& cc, cublasHandle_t h, uint64_t seed, cudaStream_t s) {
  const size_t n = (size_t)cc.M * cc.N;
  Inputs in;
  in.alloc(Problem{nullptr, nullptr, nullptr, cc.M, cc.N, cc.K}, seed, s);
  float *ref, *blas;
  CK(cudaMalloc(&ref, n * 4)); CK(cudaMalloc(&blas, n * 4));
  CK(cudaMemsetAsync(ref, 0xFF, n * 4, s)); CK(cudaMemsetAsync(blas, 0xFF, n * 4, s));
  CK(portable_f32(cc.l, Problem{in.a, in.b, ref, cc.M, cc.N, cc.K}, 0, s));
  cublasSetStream(h, s);
  const bool blas_ok = cublas_gemm(h, cc.l, Problem{in.a, in.b, blas, cc.M, cc.N, cc.K}, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
  const ErrSums eo = rel_error(blas, ref, n, s);  // oracle vs cuBLAS: both fp32 out
  Guarded out = run_sm90(cc, in, s), again = run_sm90(cc, in, s);
  const ErrSums e = cc.f32 ? rel_error((const float*)out.c(), ref, n, s)
                           : rel_error((const __nv_bfloat16*)out.c(), ref, n, s);
  const unsigned long long guard = out.guard_damage(s);
  const bool same = bitwise_equal(out, again);
  const double rel = std::sqrt(e.diff2 / e.ref2), orel = std::sqrt(eo.diff2 / eo.ref2);
  const double tol = cc.f32 ? 1e-5 : 1e-2;
  const bool pass = blas_ok && orel < 1e-5 && eo.nonfinite == 0 && e.nonfinite == 0 && guard == 0 && same &&
                    rel < tol && std::isfinite(rel);
  printf("check %s %-11s %s M=%5d N=%5d K=%5d grid=%4d head_rows=%4d  rel=%.3e (tol %.0e) unwritten=%llu guard=%llu "
         "deterministic=%d oracle_vs_cublas=%.2e  %s\n",
         layout_name(cc.l), tile_name(cc.tile), cc.f32 ? "f32 " : "bf16", cc.M, cc.N, cc.K, cc.grid, cc.head_rows, rel,
         tol, e.nonfinite, guard, (int)same, orel, pass ? "PASS" : "FAIL");
  out.free(); again.free(); in.free();
  CK(cudaFree(ref)); CK(cudaFree(blas));
  return pass;
}

int check_all(cublasHandle_t h, cudaStream_t s) {
  // Sizes: multiples of 8 where TMA needs them (leading dims), otherwise odd;
  // none a multiple of the tile except the long-K case.
  std::vector<CheckCase> cases;
  for (int ti = 0; ti < kosmos::sm90::kTileShapes; ++ti) {
    const Tile t = static_cast<Tile>(ti);
    cases.push_back({Layout::TN, 999, 776, 520, t, false, 0});
    cases.push_back({Layout::NN, 999, 777, 520, t, false, 0});
    cases.push_back({Layout::NT, 1000, 776, 517, t, false, 0});
    cases.push_back({Layout::TN, 1100, 1000, 600, t, false, 0});
    for (Layout l : {Layout::TN, Layout::NN, Layout::NT}) cases.push_back({l, 256, 512, 4096, t, false, 0});
    for (Layout l : {Layout::TN, Layout::NN, Layout::NT}) cases.push_back({l, 1536, 1280, 1000, t, false, 0});
    cases.push_back({Layout::NT, 1000, 776, 517, t, false, 3});
    cases.push_back({Layout::TN, 1536, 1280, 1000, t, false, 1});  // one CTA does every tile
    cases.push_back({Layout::NN, 64, 64, 64, t, false, 0});      // smaller than one tile
  }
  // Head and tail launches (sm90::Plan): the tail's A and C start head_rows in.
  for (Layout l : {Layout::TN, Layout::NN, Layout::NT}) {
    // 1104 rows: NT's MN-major A has leading dimension M, which TMA needs a multiple of 8.
    cases.push_back({l, 1104, 1000, 600, Tile::k128x256, false, 0, 768, Tile::k128x128});
    cases.push_back({l, 1104, 1000, 600, Tile::k128x192, false, 0, 512, Tile::k128x128});
    cases.push_back({l, 1024, 776, 520, Tile::k128x256, false, 7, 896, Tile::k128x192});
  }
  cases.push_back({Layout::TN, 999, 776, 520, Tile::k128x256, true, 0});
  cases.push_back({Layout::TN, 1536, 1280, 1000, Tile::k128x256, true, 0});
  int fails = 0;
  uint64_t seed = 0x1234u ^ (uint64_t)time(nullptr);
  for (const auto& c : cases) fails += !run_check(c, h, ++seed, s);
  printf("check: %zu cases, %d failed\n", cases.size(), fails);
  return fails;
}

}  // namespace bench

int bench_file(const char* path, cublasHandle_t h, cudaStream_t s, bool all_tiles);

int main(int argc, char** argv) {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasCreate failed\n"); return 2; }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, %d MB L2, %zu KB smem/block optin\n", prop.name, prop.multiProcessorCount,
         prop.l2CacheSize >> 20, prop.sharedMemPerBlockOptin >> 10);
  int rc = 0;
  if (argc >= 2 && !strcmp(argv[1], "check"))
    rc = (bench::check_all(h, s) + bench::check_grouped(s) + bench::check_grouped_bwd(s)) ? 1 : 0;
  else if (argc >= 2 && !strcmp(argv[1], "bench-grouped")) rc = bench::bench_grouped(s) + bench::bench_grouped_bwd(s);
  else if (argc >= 3 && !strcmp(argv[1], "bench"))
    rc = bench_file(argv[2], h, s, argc >= 4 && !strcmp(argv[3], "all-tiles"));
  else { fprintf(stderr, "usage: %s check | bench SHAPES_FILE [all-tiles] | bench-grouped\n", argv[0]); rc = 2; }
  cublasDestroy(h);
  return rc;
}
