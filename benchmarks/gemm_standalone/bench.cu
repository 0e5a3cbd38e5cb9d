// Timing half of the driver: our engine (plan_gemm's plan, at its swizzle
// group and at 8, and with all_tiles every tile shape alone) vs cuBLAS on the shapes of a file, CUDA events around each
// call, median of kIters, inputs rotated among several sets so small shapes
// are not timed out of L2.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engines.h"
#include "gemm/sm90/tile_choice.h"
#include "util.cuh"

using kosmos::gemm::Layout;
using kosmos::gemm::Problem;

namespace bench {
const char* layout_name(Layout l);
cublasStatus_t cublas_gemm(cublasHandle_t h, Layout l, const Problem& p, cudaDataType ct);

constexpr int kWarmup = 3, kIters = 20, kBurst = 8;

// Median time of `call(set)` in ms; set rotates over `sets` input sets.
// burst = 1: each call timed alone (the GPU idles between calls); burst > 1:
// `burst` calls back to back per timed interval, as a training step or a
// pipelined benchmark runs them (sustained power draw, no launch gaps).
template <class F>
float median_ms(F&& call, int sets, cudaStream_t s, int burst = 1) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int i = 0; i < kWarmup * burst; ++i) call(i % sets);
  std::vector<float> t(kIters);
  for (int i = 0; i < kIters; ++i) {
    CK(cudaEventRecord(e0, s));
    for (int j = 0; j < burst; ++j) call((i * burst + j) % sets);
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&t[i], e0, e1));
    t[i] /= burst;
  }
  CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return t[kIters / 2];
}

struct Shape {
  std::string name;
  Layout l;
  int M, N, K;
};

constexpr int kTiles = kosmos::sm90::kTileShapes;

// An idle GPU sits at a low clock (seen at 345 MHz); ~2 s of large cuBLAS
// products bring it up before the first shape is timed.
void warm_up(cublasHandle_t h, cudaStream_t s) {
  const int n = 8192;
  __nv_bfloat16 *a, *c;
  CK(cudaMalloc(&a, (size_t)n * n * 2)); CK(cudaMalloc(&c, (size_t)n * n * 2));
  fill_random<<<1024, 256, 0, s>>>(a, (size_t)n * n, 5);
  cublasSetStream(h, s);
  for (int i = 0; i < 1500; ++i) cublas_gemm(h, Layout::TN, Problem{a, a, c, n, n, n}, CUDA_R_16BF);
  CK(cudaStreamSynchronize(s));
  CK(cudaFree(a)); CK(cudaFree(c));
}

struct Ratios {
  // cuBLAS time / ours (bursts): plan_gemm's plan, the same at swizzle group 8
  // (the rule before 2026-12-01), each tile shape alone (with all_tiles).
  std::vector<double> plan, group8, tile[kTiles];
};

// What one shape times: our configurations by label, each a launch of `plan`.
struct Arm {
  std::string label;
  kosmos::sm90::Plan plan;
};

std::vector<Arm> arms_of(const Shape& sh, int sms, bool all_tiles) {
  const kosmos::sm90::Plan plan = kosmos::sm90::plan_gemm(sh.M, sh.N, sh.K, sms);
  kosmos::sm90::Plan g8 = plan;
  g8.group = 8;
  std::vector<Arm> arms{{"plan", plan}, {"group8", g8}};
  for (int ti = 0; all_tiles && ti < kTiles; ++ti)
    arms.push_back({tile_name((Tile)ti), kosmos::sm90::single((Tile)ti, sh.M)});
  return arms;
}

// cuBLAS is timed before and after our engine and the faster median kept, so
// a clock that drifts during the shape cannot favour our side.
void bench_shape(const Shape& sh, cublasHandle_t h, cudaStream_t s, bool all_tiles, Ratios& out) {
  const size_t na = (size_t)sh.M * sh.K, nb = (size_t)sh.N * sh.K, nc = (size_t)sh.M * sh.N;
  const size_t in_bytes = 2 * (na + nb);
  const int sets = (int)std::min<size_t>(8, std::max<size_t>(1, (512ull << 20) / in_bytes));
  std::vector<__nv_bfloat16*> a(sets), b(sets);
  for (int i = 0; i < sets; ++i) {
    CK(cudaMalloc(&a[i], na * 2)); CK(cudaMalloc(&b[i], nb * 2));
    fill_random<<<1024, 256, 0, s>>>(a[i], na, 77 + 2 * i);
    fill_random<<<1024, 256, 0, s>>>(b[i], nb, 78 + 2 * i);
  }
  __nv_bfloat16 *c, *cref;
  CK(cudaMalloc(&c, nc * 2)); CK(cudaMalloc(&cref, nc * 2));
  auto prob = [&](int i, void* o) { return Problem{a[i], b[i], o, sh.M, sh.N, sh.K}; };
  cublasSetStream(h, s);
  auto blas = [&](int i) { cublas_gemm(h, sh.l, prob(i, cref), CUDA_R_16BF); };
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev)); CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const std::vector<Arm> arms = arms_of(sh, sms, all_tiles);
  // [0]: calls timed alone, [1]: bursts of kBurst back-to-back calls.
  float t_blas[2];
  std::vector<float> t[2];
  for (int mode = 0; mode < 2; ++mode) {
    const int burst = mode ? kBurst : 1;
    const float before = median_ms(blas, sets, s, burst);
    for (const Arm& arm : arms)
      t[mode].push_back(median_ms([&](int i) { CK(sm90_plan(sh.l, arm.plan, prob(i, c), 0, s)); }, sets, s, burst));
    t_blas[mode] = std::min(before, median_ms(blas, sets, s, burst));
  }
  // Correctness of every timed configuration against cuBLAS on the last set.
  const int last = (kWarmup + kIters - 1) % sets;
  CK(cublas_gemm(h, sh.l, prob(last, cref), CUDA_R_16BF) == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown);
  double worst_err = 0;
  unsigned long long unwritten = 0;
  for (const Arm& arm : arms) {
    CK(cudaMemsetAsync(c, 0xFF, nc * 2, s));
    CK(sm90_plan(sh.l, arm.plan, prob(last, c), 0, s));
    const ErrSums e = rel_error(c, cref, nc, s);
    worst_err = std::max(worst_err, std::sqrt(e.diff2 / e.ref2));
    unwritten += e.nonfinite;
  }
  const double flop = 2.0 * sh.M * sh.N * (double)sh.K;
  out.plan.push_back(t_blas[1] / t[1][0]);
  out.group8.push_back(t_blas[1] / t[1][1]);
  for (int ti = 0; all_tiles && ti < kTiles; ++ti) out.tile[ti].push_back(t_blas[1] / t[1][2 + ti]);
  const kosmos::sm90::Plan& plan = arms[0].plan;
  for (int mode = 0; mode < 2; ++mode) {
    printf("bench %-5s %-16s %s M=%6d N=%6d K=%6d cublas %7.3f ms %5.0f TF | plan %s", mode ? "burst" : "alone",
           sh.name.c_str(), layout_name(sh.l), sh.M, sh.N, sh.K, t_blas[mode], flop / t_blas[mode] * 1e-9,
           tile_name(plan.head));
    if (plan.head_rows < sh.M) printf("/%s at row %d", tile_name(plan.tail), plan.head_rows);
    printf(" %5.0f TF", flop / t[mode][0] * 1e-9);
    for (size_t i = 0; i < arms.size(); ++i) printf(" %s %.3f", arms[i].label.c_str(), t_blas[mode] / t[mode][i]);
    printf(" | max_rel_vs_cublas %.2e unwritten %llu\n", worst_err, unwritten);
  }
  fflush(stdout);
  for (int i = 0; i < sets; ++i) { CK(cudaFree(a[i])); CK(cudaFree(b[i])); }
  CK(cudaFree(c)); CK(cudaFree(cref));
}

}  // namespace bench

int bench_file(const char* path, cublasHandle_t h, cudaStream_t s, bool all_tiles) {
  std::ifstream f(path);
  if (!f) { fprintf(stderr, "cannot open %s\n", path); return 2; }
  std::string line;
  bench::Ratios r[3];
  bench::warm_up(h, s);
  while (std::getline(f, line)) {
    std::istringstream ls(line);
    bench::Shape sh;
    std::string lay;
    if (!(ls >> sh.name >> lay >> sh.M >> sh.N >> sh.K)) continue;
    sh.l = lay == "TN" ? Layout::TN : lay == "NN" ? Layout::NN : Layout::NT;
    bench::bench_shape(sh, h, s, all_tiles, r[(int)sh.l]);
  }
  auto geo = [](const std::vector<double>& v) {
    double l = 0;
    for (double x : v) l += std::log(x);
    return v.empty() ? 0.0 : std::exp(l / v.size());
  };
  for (Layout l : {Layout::TN, Layout::NN, Layout::NT}) {
    const auto& x = r[(int)l];
    if (x.plan.empty()) continue;
    printf("geomean %s over %zu shapes (cuBLAS time / ours, bursts of %d calls): plan_gemm %.3f  group8 %.3f",
           bench::layout_name(l), x.plan.size(), bench::kBurst, geo(x.plan), geo(x.group8));
    for (int ti = 0; all_tiles && ti < bench::kTiles; ++ti)
      printf(" %s %.3f", bench::tile_name((bench::Tile)ti), geo(x.tile[ti]));
    printf("\n");
  }
  return 0;
}
