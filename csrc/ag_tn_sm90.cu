// Preparation and launch of the Hopper-builder AG+GEMM kernels (sm_90a only):
// one per transport (pull, push), and ag_nn's (pull, NN layout).
#include "ag_tn_sm90.h"
#include "sm90_prepare.h"
#include "tp/ag_gemm_sm90.cuh"

namespace kosmos {
namespace {

// 128x256 tiles, 3 stages and the staged epilogue: the engine's wide
// configuration (~211 KB of smem). ag_nn reads w [k, n] as the engine's K-major
// B (gemm/tile_problem.h): the same tiles, another layout.
using AgCfg = sm90::TileConfig<gemm::Layout::TN, 128, 256, 3>;
using AgNnCfg = sm90::TileConfig<gemm::Layout::NN, 128, 256, 3>;
static_assert(AgCfg::kBN == AgNnCfg::kBN, "ag_tn_sm90_tile_n serves both layouts");
Sm90State g_state[3];  // [0] ag_tn pull, [1] ag_tn push, [2] ag_nn (pull)

template <class Cfg, class Tr>
std::string prepare_one(int ordinal, Sm90State& state) {
  return prepare_sm90("kosmos_ag_tn", reinterpret_cast<const void*>(&ag_tn_sm90_kernel<Cfg, Tr>), Cfg::kThreads,
                      (int)sm90::SharedStorage<Cfg>::kLaunchBytes, ordinal, state, set_timeout_mailbox,
                      TimeoutUnit::kAgTnSm90);
}

// tp > 1: A is the gather region (every shard, own included, lands there under
// pull); tp == 1: x itself, nothing to gather.
template <class Cfg>
sm90::Params<Cfg> gather_params(const AgParams<bf16_t>& ag) {
  const void* a = ag.tp > 1 ? static_cast<const void*>(ag.heap[ag.rank] + kHeapDataOffset) : ag.x;
  const int M = ag.tp > 1 ? ag.tp * ag.shape.T * Cfg::kBM : ag.rows;
  return sm90::make_params<Cfg>(gemm::Problem{a, ag.w, nullptr, M, ag.N, ag.K});
}

}  // namespace

int ag_tn_sm90_tile_n() { return AgCfg::kBN; }

std::string ag_tn_sm90_prepare(int ordinal) {
  std::string err = prepare_one<AgCfg, Pull>(ordinal, g_state[0]);
  if (err.empty()) err = prepare_one<AgCfg, Push>(ordinal, g_state[1]);
  return err.empty() ? prepare_one<AgNnCfg, Pull>(ordinal, g_state[2]) : err;
}

bool ag_tn_sm90_ready(int ordinal) { return sm90_ready(g_state[0], ordinal) && sm90_ready(g_state[1], ordinal); }
bool ag_nn_sm90_ready(int ordinal) { return sm90_ready(g_state[2], ordinal); }

template <class Tr>
cudaError_t ag_tn_sm90_launch(const AgParams<bf16_t>& ag, int grid, cudaStream_t stream) {
  AgSm90Params<AgCfg> p{ag, gather_params<AgCfg>(ag), {}, {}};
  if constexpr (Tr::kPush)  // the own shard's tiles read x itself (tp/ag_gemm_sm90.cuh)
    p.own = sm90::make_operand_tma<AgCfg::kMajorA, typename AgCfg::RingA>(reinterpret_cast<const sm90::bf16*>(ag.x),
                                                                           ag.rows, ag.K, ag.K);
  ag_tn_sm90_kernel<AgCfg, Tr><<<grid, AgCfg::kThreads, sm90::SharedStorage<AgCfg>::kLaunchBytes, stream>>>(p);
  return cudaGetLastError();
}
template cudaError_t ag_tn_sm90_launch<Pull>(const AgParams<bf16_t>&, int, cudaStream_t);
template cudaError_t ag_tn_sm90_launch<Push>(const AgParams<bf16_t>&, int, cudaStream_t);

cudaError_t ag_nn_sm90_launch(const AgParams<bf16_t>& ag, int grid, cudaStream_t stream) {
  AgSm90Params<AgNnCfg> p{ag, gather_params<AgNnCfg>(ag), {}, {}};
  // The own shard's tiles read dY itself while the movers publish it; the peer
  // tiles read the gathered dY where whole tile rows of it are one shard's
  // (tp/ag_gemm_sm90.cuh, kOwnFromX, pull_to_out_only).
  using Bf = const sm90::bf16*;
  p.own = sm90::make_operand_tma<AgNnCfg::kMajorA, typename AgNnCfg::RingA>(Bf(ag.x), ag.rows, ag.K, ag.K);
  p.ag.pull_to_out_only = ag.tp > 1 && ag.m_local % AgNnCfg::kBM == 0;
  if (p.ag.pull_to_out_only)
    p.out = sm90::make_operand_tma<AgNnCfg::kMajorA, typename AgNnCfg::RingA>(Bf(ag.g_out), ag.tp * ag.rows, ag.K,
                                                                              ag.K);
  ag_tn_sm90_kernel<AgNnCfg, Pull><<<grid, AgNnCfg::kThreads, sm90::SharedStorage<AgNnCfg>::kLaunchBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kosmos
