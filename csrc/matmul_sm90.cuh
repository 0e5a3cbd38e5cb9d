// Definition of sm90_gemm_launch<L>, included by exactly one translation unit
// per layout (csrc/matmul_sm90_{tn,nn,nt}.cu).
#pragma once
#include "gemm/elem.h"
#include "gemm/sm90/gemm_kernel.cuh"
#include "matmul_sm90.h"

namespace kosmos {

// Per layout: 128x256 with 3 stages or 128x128 with 5, each beside its staged
// output tile (211 and 199 KB of smem).
template <gemm::Layout L>
cudaError_t sm90_gemm_launch(sm90::TileShape t, const gemm::Problem& p, int grid, cudaStream_t s) {
  using sm90::TileConfig;
  if (t == sm90::TileShape::k128x256) return sm90::launch_gemm<TileConfig<L, 128, 256, 3>, gemm::bf16>(p, grid, s);
  return sm90::launch_gemm<TileConfig<L, 128, 128, 5>, gemm::bf16>(p, grid, s);
}

}  // namespace kosmos
