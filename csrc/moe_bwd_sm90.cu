// Preparation and launch of the MoE backward's expert GEMMs with Hopper
// builders (sm_90a only).
#include "moe/grouped_bwd_sm90.cuh"
#include "moe_bwd_sm90.h"

namespace kosmos {
namespace {

// The engine's wide configuration (128x256, 3 stages, staged epilogue), as the
// forward's, in the backward's two layouts: the dgrads K-major x K-major, the
// wgrads MN-major x MN-major (gemm/tile_problem.h).
using DgradCfg = sm90::TileConfig<gemm::Layout::NN, 128, 256, 3>;
using WgradCfg = sm90::TileConfig<gemm::Layout::NT, 128, 256, 3>;

}  // namespace

std::string grouped_dgrad_sm90_unsupported(int M, int N, int K, int E) {
  return moe::dgrad_unsupported<DgradCfg>(M, N, K, E);
}

cudaError_t grouped_dgrad_sm90_launch(const void* a, const void* b, void* c, const int* tile_expert, int M, int N,
                                      int K, int E, int grid, cudaStream_t stream) {
  return moe::grouped_dgrad_launch<DgradCfg>(a, b, c, tile_expert, M, N, K, E, grid, stream);
}

cudaError_t grouped_swiglu_bwd_sm90_launch(const void* dy, const void* w2, const void* h1, void* dh1,
                                           const int* tile_expert, int M, int I, int H, int E, int grid,
                                           cudaStream_t stream) {
  return moe::swiglu_bwd_launch<DgradCfg>(dy, w2, h1, dh1, tile_expert, M, I, H, E, grid, stream);
}

std::string grouped_wgrad_sm90_unsupported(int R, int P, int Q, int E) {
  return moe::wgrad_unsupported<WgradCfg>(R, P, Q, E);
}

cudaError_t grouped_wgrad_sm90_launch(const void* a, const void* b, void* c, const int* expert_rb, int R, int P, int Q,
                                      int E, int grid, cudaStream_t stream) {
  return moe::grouped_wgrad_launch<WgradCfg>(a, b, c, expert_rb, R, P, Q, E, grid, stream);
}

}  // namespace kosmos
