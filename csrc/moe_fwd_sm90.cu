// Preparation and launch of the MoE forward megakernel and the grouped expert
// GEMMs with Hopper builders (sm_90a only).
#include "moe/fwd_sm90.cuh"
#include "moe/grouped_gemm_sm90.cuh"
#include "moe_fwd_sm90.h"
#include "sm90_prepare.h"

namespace kosmos {
namespace {

// The engine's wide configuration (128x256, 3 stages, staged epilogue): a
// GEMM1 tile is 128 gate and 128 up columns, a GEMM2 tile 256 of hidden.
using MoeCfg = sm90::TileConfig<gemm::Layout::TN, 128, 256, 3>;
// The kernel's two instantiations (kPeers: EP = 1 and EP > 1).
Sm90StatePair g_state;

}  // namespace

std::string moe_fwd_sm90_prepare(int ordinal) {
  return prepare_sm90_pair("kosmos_moe_forward",
                           reinterpret_cast<const void*>(&moe::moe_fwd_sm90_kernel<MoeCfg, false>),
                           reinterpret_cast<const void*>(&moe::moe_fwd_sm90_kernel<MoeCfg, true>), MoeCfg::kThreads,
                           (int)sm90::SharedStorage<MoeCfg>::kLaunchBytes, ordinal, g_state, set_timeout_mailbox,
                           TimeoutUnit::kMoeFwdSm90);
}

bool moe_fwd_sm90_ready(int ordinal) { return sm90_ready(g_state, ordinal); }

std::string moe_fwd_sm90_unsupported(int H, int I, int E, int k) { return moe::moe_fwd_sm90_unsupported(H, I, E, k); }

// A GEMM1 tile is kBN / 2 gate and as many up columns, a GEMM2 tile kBN of H.
void moe_fwd_sm90_columns(int H, int I, int* nt1, int* nt2) {
  *nt1 = I / (MoeCfg::kBN / 2);
  *nt2 = (H + MoeCfg::kBN - 1) / MoeCfg::kBN;
}

cudaError_t moe_fwd_sm90_launch(const moe::MoeFwdParams& m, const void* w1, const void* w2, const void* sw1,
                                const void* sw2, int grid, cudaStream_t stream) {
  return moe::moe_fwd_sm90_launch<MoeCfg>(m, w1, w2, sw1, sw2, grid, stream);
}

std::string grouped_gemm_sm90_unsupported(int M, int N, int K, int E) {
  return moe::grouped_unsupported<MoeCfg>(M, N, K, E);
}

cudaError_t grouped_gemm_sm90_launch(const void* a, const void* b, void* c, const int* tile_expert, int M, int N,
                                     int K, int E, int grid, cudaStream_t stream) {
  return moe::grouped_gemm_launch<MoeCfg>(a, b, c, tile_expert, M, N, K, E, grid, stream);
}

}  // namespace kosmos
