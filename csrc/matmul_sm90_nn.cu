// Hopper engine for the NN layout of kosmos_matmul (sm_90a only).
#include "matmul_sm90.cuh"

namespace kosmos {
cudaError_t sm90_gemm_nn(sm90::TileShape t, const gemm::Problem& p, int grid, cudaStream_t s) {
  return sm90_gemm_launch<gemm::Layout::NN>(t, p, grid, s);
}
}  // namespace kosmos
