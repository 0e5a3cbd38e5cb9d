// Preparation and launch of the Hopper-builder bulk RS || NT kernel (sm_90a only).
#include "bulk_rs_nt_sm90.h"
#include "sm90_prepare.h"
#include "tp/bulk_rs_sm90.cuh"

namespace kosmos {
namespace {

// The engine's wide configuration (128x256, 3 stages, staged epilogue), as the
// standalone NT GEMM's usual pick: dw's tiles are plain GEMM tiles of the
// layer's weight gradient (k x n per rank, thousands of tiles on the paper's
// large shapes), where 128x256 runs the best full waves (sm90::kWaveEfficiency:
// 128x128 does 0.84 of its work per wave time); on the few-tile shapes
// (8B-QKV: 96 tiles) the SMs a short last wave leaves idle push and reduce.
using BulkRsCfg = sm90::TileConfig<gemm::Layout::NT, 128, 256, 3>;
Sm90State g_state;

}  // namespace

int bulk_rs_nt_sm90_tile_n() { return BulkRsCfg::kBN; }

std::string bulk_rs_nt_sm90_prepare(int ordinal) {
  return prepare_sm90("kosmos_bulk_rs_nt", reinterpret_cast<const void*>(&bulk_rs_nt_sm90_kernel<BulkRsCfg>),
                      BulkRsCfg::kThreads, (int)sm90::SharedStorage<BulkRsCfg>::kLaunchBytes, ordinal, g_state,
                      set_timeout_mailbox, TimeoutUnit::kBulkRsSm90);
}

bool bulk_rs_nt_sm90_ready(int ordinal) { return sm90_ready(g_state, ordinal); }

cudaError_t bulk_rs_nt_sm90_launch(const BulkRsParams<bf16_t>& rs, int grid, cudaStream_t stream) {
  // The engine's terms (gemm/tile_problem.h, NT): C [k, n] = sum over M of A(m_e, row) B(n, row).
  BulkRsSm90Params<BulkRsCfg> p{rs, sm90::make_params<BulkRsCfg>(gemm::Problem{rs.xg, rs.dy, rs.dw, rs.k, rs.n, rs.M})};
  bulk_rs_nt_sm90_kernel<BulkRsCfg>
      <<<grid, BulkRsCfg::kThreads, sm90::SharedStorage<BulkRsCfg>::kLaunchBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kosmos
