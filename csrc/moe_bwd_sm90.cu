// Preparation and launch of the MoE backward's expert GEMMs with Hopper
// builders (sm_90a only).
#include "moe/bwd_sm90.cuh"
#include "moe/grouped_bwd_sm90.cuh"
#include "moe_bwd_sm90.h"
#include "sm90_prepare.h"

namespace kosmos {
namespace {

// The engine's wide configuration (128x256, 3 stages, staged epilogue), as the
// forward's, in the backward's two layouts: the dgrads K-major x K-major, the
// wgrads MN-major x MN-major (gemm/tile_problem.h).
using DgradCfg = sm90::TileConfig<gemm::Layout::NN, 128, 256, 3>;
using WgradCfg = sm90::TileConfig<gemm::Layout::NT, 128, 256, 3>;
// The kernel's two instantiations (kPeers: EP = 1 and EP > 1).
Sm90StatePair g_state;

}  // namespace

std::string moe_bwd_sm90_prepare(int ordinal) {
  return prepare_sm90_pair("kosmos_moe_backward",
                           reinterpret_cast<const void*>(&moe::moe_bwd_sm90_kernel<DgradCfg, WgradCfg, false>),
                           reinterpret_cast<const void*>(&moe::moe_bwd_sm90_kernel<DgradCfg, WgradCfg, true>),
                           DgradCfg::kThreads, (int)sm90::SharedStorage<DgradCfg>::kLaunchBytes, ordinal, g_state,
                           set_timeout_mailbox, TimeoutUnit::kMoeBwdSm90);
}

bool moe_bwd_sm90_ready(int ordinal) { return sm90_ready(g_state, ordinal); }

std::string moe_bwd_sm90_unsupported(int H, int I, int E, int k) { return moe::moe_bwd_sm90_unsupported(H, I, E, k); }

// A dgrad2 tile is kBN columns of I (d(gate) and d(up) of them), a dgrad1 tile kBN of H.
void moe_bwd_sm90_columns(int H, int I, int* nt1, int* nt2) {
  *nt1 = (I + DgradCfg::kBN - 1) / DgradCfg::kBN;
  *nt2 = (H + DgradCfg::kBN - 1) / DgradCfg::kBN;
}

cudaError_t moe_bwd_sm90_launch(const moe::MoeFwdParams& m, const void* w1, const void* w2, const void* x_rows,
                                const void* act, const void* h1, void* dh1, void* dw1, void* dw2, const void* x,
                                const void* hs, const void* sw1, const void* sw2, void* dsw1, void* dsw2, int grid,
                                cudaStream_t stream) {
  return moe::moe_bwd_sm90_launch<DgradCfg, WgradCfg>(m, w1, w2, x_rows, act, h1, dh1, dw1, dw2, x, hs, sw1, sw2,
                                                      dsw1, dsw2, grid, stream);
}

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
