// Entry points of the Hopper tile engine for kosmos_matmul: bf16 operands and
// output, on the current device. Each layout lives in its own translation unit
// (csrc/matmul_sm90_{tn,nn,nt}.cu, built for sm_90a only) so the heavy CuTe
// instantiations compile in parallel.
#pragma once
#include <cuda_runtime.h>

#include "gemm/sm90/tile_choice.h"
#include "gemm/tile_problem.h"

namespace kosmos {

// C = A.B of `p` as `plan` says (one launch, or a head and a tail launch: see
// sm90::Plan) on `grid` CTAs (<= 0: one per SM). cudaErrorInvalidValue when
// sm90::unsupported(p, layout) says why not, or for a head_rows that is not a
// positive multiple of 128.
cudaError_t sm90_gemm_tn(const sm90::Plan& plan, const gemm::Problem& p, int grid, cudaStream_t s);
cudaError_t sm90_gemm_nn(const sm90::Plan& plan, const gemm::Problem& p, int grid, cudaStream_t s);
cudaError_t sm90_gemm_nt(const sm90::Plan& plan, const gemm::Problem& p, int grid, cudaStream_t s);

}  // namespace kosmos
