// Portable-engine oracle instantiations (fp32 output, all three layouts).
#include "engines.h"
#include "gemm/portable/tile_engine.cuh"

namespace bench {
using kosmos::gemm::Layout;

cudaError_t portable_f32(Layout l, const kosmos::gemm::Problem& p, int grid, cudaStream_t s) {
  using kosmos::portable::portable_gemm;
  const int tiles = kosmos::gemm::ceil_div(p.M, 128) * kosmos::gemm::ceil_div(p.N, 128);
  grid = (grid <= 0 || grid > tiles) ? tiles : grid;
  if (l == Layout::TN) portable_gemm<Layout::TN, float><<<grid, 256, 0, s>>>(p);
  if (l == Layout::NN) portable_gemm<Layout::NN, float><<<grid, 256, 0, s>>>(p);
  if (l == Layout::NT) portable_gemm<Layout::NT, float><<<grid, 256, 0, s>>>(p);
  return cudaGetLastError();
}

}  // namespace bench
