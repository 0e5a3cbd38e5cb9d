// Preparation and launch of the Hopper-builder GEMM+RS kernel (sm_90a only).
#include "tn_rs_sm90.h"
#include "sm90_prepare.h"
#include "tp/gemm_rs_sm90.cuh"

namespace kosmos {
namespace {

// 128x256 tiles, 4 stages; the epilogue stages fp32 or bf16 partial tiles.
using RsCfg = sm90::TileConfig<gemm::Layout::TN, 128, 256, 4>;
Sm90State g_state_f32, g_state_bf16;

}  // namespace

int tn_rs_sm90_tile_n() { return RsCfg::kBN; }

std::string tn_rs_sm90_prepare(int ordinal) {
  const int smem = (int)sm90::SharedStorage<RsCfg>::kLaunchBytes;
  std::string err = prepare_sm90("kosmos_tn_rs", reinterpret_cast<const void*>(&tn_rs_sm90_kernel<RsCfg, float>),
                                 RsCfg::kThreads, smem, ordinal, g_state_f32, set_timeout_mailbox, TimeoutUnit::kTnRsSm90);
  if (!err.empty()) return err;
  return prepare_sm90("kosmos_tn_rs", reinterpret_cast<const void*>(&tn_rs_sm90_kernel<RsCfg, bf16_t>),
                      RsCfg::kThreads, smem, ordinal, g_state_bf16, set_timeout_mailbox, TimeoutUnit::kTnRsSm90);
}

bool tn_rs_sm90_ready(int ordinal) { return sm90_ready(g_state_f32, ordinal) && sm90_ready(g_state_bf16, ordinal); }

cudaError_t tn_rs_sm90_launch(const RsParams<bf16_t>& rs, int grid, cudaStream_t stream) {
  RsSm90Params<RsCfg> p{rs, {}};
  p.g = sm90::make_params<RsCfg>(gemm::Problem{rs.x, rs.w, nullptr, rs.tp * rs.rows, rs.N, rs.K});
  const size_t smem = sm90::SharedStorage<RsCfg>::kLaunchBytes;
  if (rs.stage_bf16)
    tn_rs_sm90_kernel<RsCfg, bf16_t><<<grid, RsCfg::kThreads, smem, stream>>>(p);
  else
    tn_rs_sm90_kernel<RsCfg, float><<<grid, RsCfg::kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kosmos
