// The Hopper engine with fp32 output (the GEMM+RS partials' configuration:
// register-store epilogue, 4 stages), TN 128x256 only. The bf16 configurations
// are the library's own (csrc/matmul_sm90_{tn,nn,nt}.cu, linked in).
#include "engines.h"
#include "gemm/sm90/gemm_kernel.cuh"

namespace bench {

cudaError_t sm90_tn_f32(const kosmos::gemm::Problem& p, int grid, cudaStream_t s) {
  using kosmos::sm90::TileConfig;
  return kosmos::sm90::launch_gemm<TileConfig<kosmos::gemm::Layout::TN, 128, 256, 4, false>, float>(p, grid, s);
}

}  // namespace bench
