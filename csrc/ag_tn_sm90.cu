// Preparation and launch of the Hopper-builder AG+GEMM kernels (sm_90a only):
// one per transport (pull, push).
#include "ag_tn_sm90.h"
#include "sm90_prepare.h"
#include "tp/ag_gemm_sm90.cuh"

namespace kosmos {
namespace {

// 128x256 tiles, 3 stages and the staged epilogue: the engine's wide
// configuration (~211 KB of smem).
using AgCfg = sm90::TileConfig<gemm::Layout::TN, 128, 256, 3>;
Sm90State g_state[2];  // [push]

template <bool kPush>
std::string prepare_one(int ordinal) {
  return prepare_sm90("kosmos_ag_tn", reinterpret_cast<const void*>(&ag_tn_sm90_kernel<AgCfg, kPush>), AgCfg::kThreads,
                      (int)sm90::SharedStorage<AgCfg>::kLaunchBytes, ordinal, g_state[kPush], set_timeout_mailbox,
                      TimeoutUnit::kAgTnSm90);
}

}  // namespace

int ag_tn_sm90_tile_n() { return AgCfg::kBN; }

std::string ag_tn_sm90_prepare(int ordinal) {
  std::string err = prepare_one<false>(ordinal);
  return err.empty() ? prepare_one<true>(ordinal) : err;
}

bool ag_tn_sm90_ready(int ordinal) { return sm90_ready(g_state[0], ordinal) && sm90_ready(g_state[1], ordinal); }

cudaError_t ag_tn_sm90_launch(const AgParams<bf16_t>& ag, int grid, cudaStream_t stream) {
  AgSm90Params<AgCfg> p{ag, {}, {}};
  // tp > 1: A is the gather region (every shard, own included, lands there);
  // tp == 1: x itself, nothing to gather.
  const void* a = ag.tp > 1 ? static_cast<const void*>(ag.heap[ag.rank] + kHeapDataOffset) : ag.x;
  const int M = ag.tp > 1 ? ag.tp * ag.shape.T * AgCfg::kBM : ag.rows;
  p.g = sm90::make_params<AgCfg>(gemm::Problem{a, ag.w, nullptr, M, ag.N, ag.K});
  if (ag.shape.push)  // the own shard's tiles read x itself (tp/ag_gemm_sm90.cuh)
    p.own = sm90::make_operand_tma<AgCfg::kMajorA, typename AgCfg::RingA>(reinterpret_cast<const sm90::bf16*>(ag.x),
                                                                           ag.rows, ag.K, ag.K);
  const auto kernel = ag.shape.push ? &ag_tn_sm90_kernel<AgCfg, true> : &ag_tn_sm90_kernel<AgCfg, false>;
  kernel<<<grid, AgCfg::kThreads, sm90::SharedStorage<AgCfg>::kLaunchBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kosmos
