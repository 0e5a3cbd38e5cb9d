// Entry points of the engines the standalone driver exercises. The bf16 Hopper
// configurations are the library's (csrc/matmul_sm90.h), so the driver times
// exactly what kosmos_matmul launches.
#pragma once
#include <cuda_runtime.h>

#include "gemm/tile_problem.h"
#include "matmul_sm90.h"

namespace bench {

using Tile = kosmos::sm90::TileShape;
using kosmos::sm90::tile_name;

// fp32 partials: TN 128x256 only.
cudaError_t sm90_tn_f32(const kosmos::gemm::Problem& p, int grid, cudaStream_t s);

// bf16 C as `plan` says: one launch, or a head and a tail launch.
inline cudaError_t sm90_plan(kosmos::gemm::Layout l, const kosmos::sm90::Plan& plan, const kosmos::gemm::Problem& p,
                             int grid, cudaStream_t s) {
  switch (l) {
    case kosmos::gemm::Layout::TN: return kosmos::sm90_gemm_tn(plan, p, grid, s);
    case kosmos::gemm::Layout::NN: return kosmos::sm90_gemm_nn(plan, p, grid, s);
    default: return kosmos::sm90_gemm_nt(plan, p, grid, s);
  }
}

// C is bf16 unless fp32_out (then TN 128x256 only; others return cudaErrorNotSupported).
inline cudaError_t sm90(kosmos::gemm::Layout l, Tile t, bool fp32_out, const kosmos::gemm::Problem& p, int grid,
                        cudaStream_t s) {
  if (fp32_out)
    return l == kosmos::gemm::Layout::TN && t == Tile::k128x256 ? sm90_tn_f32(p, grid, s) : cudaErrorNotSupported;
  return sm90_plan(l, kosmos::sm90::single(t, p.M), p, grid, s);
}

// The MoE expert GEMMs (kernels/moe/grouped_gemm_sm90.cuh) against the portable
// oracle, expert by expert (grouped.cu); returns the number of failed cases.
int check_grouped(cudaStream_t s);
// Times them on every MoE preset's balanced rows: the MoE benchmark's floor (grouped.cu).
int bench_grouped(cudaStream_t s);
// The backward's grouped GEMMs (dgrad, wgrad) on both schedules (grouped_bwd.cu): check, benchmark.
int check_grouped_bwd(cudaStream_t s);
int bench_grouped_bwd(cudaStream_t s);

// Portable oracle, fp32 output.
cudaError_t portable_f32(kosmos::gemm::Layout l, const kosmos::gemm::Problem& p, int grid, cudaStream_t s);

}  // namespace bench
