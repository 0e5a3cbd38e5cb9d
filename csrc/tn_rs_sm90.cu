// Preparation and launch of the Hopper-builder GEMM+RS kernels (sm_90a only):
// one per staging type and transport.
#include "tn_rs_sm90.h"
#include "sm90_prepare.h"
#include "tp/gemm_rs_sm90.cuh"

namespace kosmos {
namespace {

// 128x256 tiles. bf16 partials leave through the staged epilogue (3 stages
// beside it); fp32 partial tiles would not fit beside the ring, so they are
// stored from registers with 4 stages.
using RsCfgBf16 = sm90::TileConfig<gemm::Layout::TN, 128, 256, 3>;
using RsCfgF32 = sm90::TileConfig<gemm::Layout::TN, 128, 256, 4, /*SmemEpi=*/false>;
static_assert(RsCfgBf16::kBN == RsCfgF32::kBN, "one staging tile width for both");
// [0] pull, [1] push: the kernels of each staging type (tn_rs_sm90_kernel's
// transport); g_state_fold: bf16 PushFold (the own chunk folded).
Sm90State g_state_f32[2], g_state_bf16[2], g_state_fold;

template <class Cfg, class StageT, class Tr>
std::string prepare_one(int ordinal, Sm90State& state) {
  return prepare_sm90("kosmos_tn_rs", reinterpret_cast<const void*>(&tn_rs_sm90_kernel<Cfg, StageT, Tr>),
                      Cfg::kThreads, (int)sm90::SharedStorage<Cfg>::kLaunchBytes, ordinal, state, set_timeout_mailbox,
                      TimeoutUnit::kTnRsSm90);
}

}  // namespace

int tn_rs_sm90_tile_n() { return RsCfgBf16::kBN; }

std::string tn_rs_sm90_prepare(int ordinal) {
  std::string err = prepare_one<RsCfgF32, float, Pull>(ordinal, g_state_f32[0]);
  if (err.empty()) err = prepare_one<RsCfgF32, float, Push>(ordinal, g_state_f32[1]);
  if (err.empty()) err = prepare_one<RsCfgBf16, bf16_t, Pull>(ordinal, g_state_bf16[0]);
  if (err.empty()) err = prepare_one<RsCfgBf16, bf16_t, Push>(ordinal, g_state_bf16[1]);
  if (err.empty()) err = prepare_one<RsCfgBf16, bf16_t, PushFold>(ordinal, g_state_fold);
  return err;
}

bool tn_rs_sm90_ready(int ordinal) {
  for (int push = 0; push < 2; ++push)
    if (!sm90_ready(g_state_f32[push], ordinal) || !sm90_ready(g_state_bf16[push], ordinal)) return false;
  return sm90_ready(g_state_fold, ordinal);
}

namespace {

template <class Cfg, class StageT, class Tr>
cudaError_t launch(const RsParams<bf16_t>& rs, int grid, cudaStream_t stream) {
  RsSm90Params<Cfg> p{rs, {}, {}, {}};
  p.g = sm90::make_params<Cfg>(gemm::Problem{rs.x, rs.w, nullptr, rs.tp * rs.rows, rs.N, rs.K});
  if constexpr (Cfg::kSmemEpilogue) {  // bf16 partials leave by TMA store (RsSm90Hooks::store_box)
    const int slot_rows = rs.tp * rs.shape.T * rs.shape.NT * Cfg::kBM;
    for (int r = 0; r < rs.tp; ++r)
      p.stage_map[r] = sm90::make_output_tma<Cfg>(rs.heap[r] + kHeapDataOffset, slot_rows, rs.tile_n, rs.tile_n);
    p.y_map = sm90::make_output_tma<Cfg>(rs.y, rs.rows, rs.N, rs.N);
  }
  tn_rs_sm90_kernel<Cfg, StageT, Tr><<<grid, Cfg::kThreads, sm90::SharedStorage<Cfg>::kLaunchBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

// The caller keeps the fold to bf16 staging (tn_rs_run); fp32 staging has no fold kernel.
template <class Tr>
cudaError_t tn_rs_sm90_launch(const RsParams<bf16_t>& rs, int grid, cudaStream_t stream) {
  if constexpr (Tr::kFold)
    return rs.stage_bf16 ? launch<RsCfgBf16, bf16_t, Tr>(rs, grid, stream) : cudaErrorInvalidValue;
  else
    return rs.stage_bf16 ? launch<RsCfgBf16, bf16_t, Tr>(rs, grid, stream)
                         : launch<RsCfgF32, float, Tr>(rs, grid, stream);
}
template cudaError_t tn_rs_sm90_launch<Pull>(const RsParams<bf16_t>&, int, cudaStream_t);
template cudaError_t tn_rs_sm90_launch<Push>(const RsParams<bf16_t>&, int, cudaStream_t);
template cudaError_t tn_rs_sm90_launch<PushFold>(const RsParams<bf16_t>&, int, cudaStream_t);

}  // namespace kosmos
