// Preparation and launch of the Hopper-builder GEMM+RS kernel (sm_90a only).
#include "tn_rs_sm90.h"
#include "sm90_prepare.h"
#include "tp/gemm_rs_sm90.cuh"

namespace kosmos {
namespace {

// 128x256 tiles, 4 stages, fp32 epilogue into the staging buffer.
using RsCfg = sm90::TileConfig<gemm::Layout::TN, 128, 256, 4>;
Sm90State g_state;

}  // namespace

int tn_rs_sm90_tile_n() { return RsCfg::kBN; }

std::string tn_rs_sm90_prepare(int ordinal) {
  return prepare_sm90("kosmos_tn_rs", reinterpret_cast<const void*>(&tn_rs_sm90_kernel<RsCfg>), RsCfg::kThreads,
                      (int)sm90::SharedStorage<RsCfg>::kLaunchBytes, ordinal, g_state);
}

bool tn_rs_sm90_ready(int ordinal) { return sm90_ready(g_state, ordinal); }

cudaError_t tn_rs_sm90_launch(const RsParams<bf16_t>& rs, int grid, cudaStream_t stream) {
  RsSm90Params<RsCfg> p{rs, {}};
  p.g = sm90::make_params<RsCfg>(gemm::Problem{rs.x, rs.w, nullptr, rs.tp * rs.rows, rs.N, rs.K});
  tn_rs_sm90_kernel<RsCfg><<<grid, RsCfg::kThreads, sm90::SharedStorage<RsCfg>::kLaunchBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kosmos
