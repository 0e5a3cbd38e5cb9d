// Timing half of the driver: our engine (both tile shapes) vs cuBLAS on the
// shapes of a file, CUDA events around each call, median of kIters, inputs
// rotated among several sets so small shapes are not timed out of L2.
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

constexpr int kWarmup = 3, kIters = 20;

// Median time of `call(set)` in ms; set rotates over `sets` input sets.
template <class F>
float median_ms(F&& call, int sets, cudaStream_t s) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int i = 0; i < kWarmup; ++i) call(i % sets);
  std::vector<float> t(kIters);
  for (int i = 0; i < kIters; ++i) {
    CK(cudaEventRecord(e0, s));
    call(i % sets);
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&t[i], e0, e1));
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

struct Ratios {
  std::vector<double> best, heur, big;  // cuBLAS time / ours: best tile, heuristic tile, 128x256 only
};

void bench_shape(const Shape& sh, cublasHandle_t h, cudaStream_t s, Ratios& out) {
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
  auto prob = [&](int i, void* out) { return Problem{a[i], b[i], out, sh.M, sh.N, sh.K}; };
  cublasSetStream(h, s);
  const float t_blas = median_ms([&](int i) { cublas_gemm(h, sh.l, prob(i, cref), CUDA_R_16BF); }, sets, s);
  float best = 1e30f;
  Tile best_tile = Tile::k128x256;
  float t_tile[2];
  for (Tile t : {Tile::k128x256, Tile::k128x128}) {
    t_tile[(int)t] = median_ms([&](int i) { CK(sm90(sh.l, t, false, prob(i, c), 0, s)); }, sets, s);
    if (t_tile[(int)t] < best) best = t_tile[(int)t], best_tile = t;
  }
  // Correctness of the timed configuration against cuBLAS on the last set.
  const int last = (kWarmup + kIters - 1) % sets;
  CK(cudaMemsetAsync(c, 0xFF, nc * 2, s));
  CK(sm90(sh.l, best_tile, false, prob(last, c), 0, s));
  CK(cublas_gemm(h, sh.l, prob(last, cref), CUDA_R_16BF) == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown);
  const ErrSums e = rel_error(c, cref, nc, s);
  const double flop = 2.0 * sh.M * sh.N * (double)sh.K;
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev)); CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int heur = (int)kosmos::sm90::choose_tile(sh.M, sh.N, sms);
  out.best.push_back(t_blas / best); out.heur.push_back(t_blas / t_tile[heur]); out.big.push_back(t_blas / t_tile[0]);
  printf("bench %-16s %s M=%6d N=%6d K=%6d  cublas %8.3f ms %6.1f TF | ours 128x256 %8.3f ms 128x128 %8.3f ms "
         "best %6.1f TF  ratio %.3f heuristic %s %.3f  rel_vs_cublas %.2e unwritten %llu\n",
         sh.name.c_str(), layout_name(sh.l), sh.M, sh.N, sh.K, t_blas, flop / t_blas * 1e-9, t_tile[0], t_tile[1],
         flop / best * 1e-9, t_blas / best, tile_name((Tile)heur), t_blas / t_tile[heur], std::sqrt(e.diff2 / e.ref2), e.nonfinite);
  fflush(stdout);
  for (int i = 0; i < sets; ++i) { CK(cudaFree(a[i])); CK(cudaFree(b[i])); }
  CK(cudaFree(c)); CK(cudaFree(cref));
}

}  // namespace bench

int bench_file(const char* path, cublasHandle_t h, cudaStream_t s) {
  std::ifstream f(path);
  if (!f) { fprintf(stderr, "cannot open %s\n", path); return 2; }
  std::string line;
  bench::Ratios r[3];
  while (std::getline(f, line)) {
    std::istringstream ls(line);
    bench::Shape sh;
    std::string lay;
    if (!(ls >> sh.name >> lay >> sh.M >> sh.N >> sh.K)) continue;
    sh.l = lay == "TN" ? Layout::TN : lay == "NN" ? Layout::NN : Layout::NT;
    bench::bench_shape(sh, h, s, r[(int)sh.l]);
  }
  auto geo = [](const std::vector<double>& v) {
    double l = 0;
    for (double x : v) l += std::log(x);
    return v.empty() ? 0.0 : std::exp(l / v.size());
  };
  for (Layout l : {Layout::TN, Layout::NN, Layout::NT}) {
    const auto& x = r[(int)l];
    if (x.best.empty()) continue;
    printf("geomean %s over %zu shapes (cuBLAS time / ours): best-tile %.3f  heuristic %.3f  128x256-only %.3f\n",
           bench::layout_name(l), x.best.size(), geo(x.best), geo(x.heur), geo(x.big));
  }
  return 0;
}
