// Entry points of the engines the standalone driver exercises; each lives in
// its own translation unit so the heavy CuTe instantiations compile in parallel.
#pragma once
#include <cuda_runtime.h>

#include "gemm/tile_problem.h"

namespace bench {

// Hopper engine tile shapes under test.
enum class Tile : int { k128x256 = 0, k128x128 = 1 };
inline const char* tile_name(Tile t) { return t == Tile::k128x256 ? "128x256" : "128x128"; }

// C is bf16 unless fp32_out (then fp32 partials; built for TN 128x256 only,
// others return cudaErrorNotSupported).
cudaError_t sm90_tn(Tile t, bool fp32_out, const kosmos::gemm::Problem& p, int grid, cudaStream_t s);
cudaError_t sm90_nn(Tile t, bool fp32_out, const kosmos::gemm::Problem& p, int grid, cudaStream_t s);
cudaError_t sm90_nt(Tile t, bool fp32_out, const kosmos::gemm::Problem& p, int grid, cudaStream_t s);

inline cudaError_t sm90(kosmos::gemm::Layout l, Tile t, bool fp32_out, const kosmos::gemm::Problem& p, int grid,
                        cudaStream_t s) {
  switch (l) {
    case kosmos::gemm::Layout::TN: return sm90_tn(t, fp32_out, p, grid, s);
    case kosmos::gemm::Layout::NN: return sm90_nn(t, fp32_out, p, grid, s);
    default: return sm90_nt(t, fp32_out, p, grid, s);
  }
}

// Portable oracle, fp32 output.
cudaError_t portable_f32(kosmos::gemm::Layout l, const kosmos::gemm::Problem& p, int grid, cudaStream_t s);

}  // namespace bench
