// Preparation and launch of the Hopper-builder bulk AG || NN kernel (sm_90a only).
#include "bulk_ag_nn_sm90.h"
#include "sm90_prepare.h"
#include "tp/bulk_ag_sm90.cuh"

namespace kosmos {
namespace {

// The engine's wide configuration (128x256, 3 stages, staged epilogue), as for
// AG+GEMM: dxp's tiles are plain GEMM tiles of a problem as large as the layer's.
using BulkCfg = sm90::TileConfig<gemm::Layout::NN, 128, 256, 3>;
Sm90State g_state;

}  // namespace

std::string bulk_ag_nn_sm90_prepare(int ordinal) {
  return prepare_sm90("kosmos_bulk_ag_nn", reinterpret_cast<const void*>(&bulk_ag_nn_sm90_kernel<BulkCfg>),
                      BulkCfg::kThreads, (int)sm90::SharedStorage<BulkCfg>::kLaunchBytes, ordinal, g_state,
                      set_timeout_mailbox, TimeoutUnit::kBulkAgSm90);
}

bool bulk_ag_nn_sm90_ready(int ordinal) { return sm90_ready(g_state, ordinal); }

cudaError_t bulk_ag_nn_sm90_launch(const BulkAgParams<bf16_t>& q, int grid, cudaStream_t stream) {
  // The engine's terms (gemm/tile_problem.h, NN): C [M, k] = A [M, n] . B [k, n]^T.
  BulkAgSm90Params<BulkCfg> p{q, sm90::make_params<BulkCfg>(gemm::Problem{q.dy, q.w, q.dx, q.M, q.k, q.n})};
  bulk_ag_nn_sm90_kernel<BulkCfg>
      <<<grid, BulkCfg::kThreads, sm90::SharedStorage<BulkCfg>::kLaunchBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kosmos
