// Definition of sm90_gemm_launch<L>, included by exactly one translation unit
// per layout (csrc/matmul_sm90_{tn,nn,nt}.cu) and by the standalone driver
// (benchmarks/gemm_standalone), so both run the same configurations.
#pragma once
#include "gemm/elem.h"
#include "gemm/sm90/gemm_kernel.cuh"
#include "matmul_sm90.h"

namespace kosmos {

// The engine configuration of each tile shape, beside its staged output tile:
// 128x256 with 3 stages (211 KB of smem), 128x192 with 4 (213 KB), 128x128
// with 5 (199 KB).
template <gemm::Layout L, sm90::TileShape T>
struct Sm90Config;
template <gemm::Layout L>
struct Sm90Config<L, sm90::TileShape::k128x256> : sm90::TileConfig<L, 128, 256, 3> {};
template <gemm::Layout L>
struct Sm90Config<L, sm90::TileShape::k128x192> : sm90::TileConfig<L, 128, 192, 4> {};
template <gemm::Layout L>
struct Sm90Config<L, sm90::TileShape::k128x128> : sm90::TileConfig<L, 128, 128, 5> {};

template <gemm::Layout L>
cudaError_t sm90_gemm_launch(sm90::TileShape t, const gemm::Problem& p, int grid, cudaStream_t s) {
  using sm90::TileShape;
  using sm90::launch_gemm;
  switch (t) {
    case TileShape::k128x256: return launch_gemm<Sm90Config<L, TileShape::k128x256>, gemm::bf16>(p, grid, s);
    case TileShape::k128x192: return launch_gemm<Sm90Config<L, TileShape::k128x192>, gemm::bf16>(p, grid, s);
    case TileShape::k128x128: return launch_gemm<Sm90Config<L, TileShape::k128x128>, gemm::bf16>(p, grid, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kosmos
