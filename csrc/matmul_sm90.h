// Entry points of the Hopper tile engine for kosmos_matmul: bf16 operands and
// output, on the current device. Each layout lives in its own translation unit
// (csrc/matmul_sm90_{tn,nn,nt}.cu, built for sm_90a only) so the heavy CuTe
// instantiations compile in parallel.
#pragma once
#include <cuda_runtime.h>

#include "gemm/sm90/tile_choice.h"
#include "gemm/tile_problem.h"

namespace kosmos {

// C = A.B of `p` with tile shape `t` on `grid` CTAs (<= 0: one per SM).
// cudaErrorInvalidValue when sm90::unsupported(p, layout) says why not.
cudaError_t sm90_gemm_tn(sm90::TileShape t, const gemm::Problem& p, int grid, cudaStream_t s);
cudaError_t sm90_gemm_nn(sm90::TileShape t, const gemm::Problem& p, int grid, cudaStream_t s);
cudaError_t sm90_gemm_nt(sm90::TileShape t, const gemm::Problem& p, int grid, cudaStream_t s);

}  // namespace kosmos
