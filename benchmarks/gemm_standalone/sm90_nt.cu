// Hopper engine instantiations for the NT layout.
#include "engines.h"
#include "gemm/sm90/gemm_kernel.cuh"

namespace bench {
using kosmos::gemm::Layout;
using kosmos::sm90::launch_gemm;
using kosmos::sm90::TileConfig;

cudaError_t sm90_nt(Tile t, bool fp32_out, const kosmos::gemm::Problem& p, int grid, cudaStream_t s) {
  if (!fp32_out) {
    if (t == Tile::k128x256) return launch_gemm<TileConfig<Layout::NT, 128, 256, 4>, kosmos::gemm::bf16>(p, grid, s);
    return launch_gemm<TileConfig<Layout::NT, 128, 128, 6>, kosmos::gemm::bf16>(p, grid, s);
  }
  return cudaErrorNotSupported;
}

}  // namespace bench
