// Hopper-builder variant of kosmos_ag_tn (csrc/ag_tn_sm90.cu, built for sm_90a
// only): kernels/tp/ag_gemm_sm90.cuh. The FFI handler (ag_tn_cuda.cu) decides
// which builders run; this is only preparation and launch.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "kosmos/types.h"
#include "tp/ag_ops.cuh"

namespace kosmos {

// Output tile width of the Hopper builders (ag_tn and ag_nn): AgShape::NT counts tiles of this.
int ag_tn_sm90_tile_n();

// Once per device at runtime init: raises the kernel's shared-memory limit and
// checks one CTA per SM. Not an error on a device that is not compute
// capability 9.0; ag_tn_sm90_ready() then says false.
std::string ag_tn_sm90_prepare(int ordinal);
bool ag_tn_sm90_ready(int ordinal);

// Launches the kernel of transport Tr (kosmos/pull.h Pull, kosmos/push.h Push:
// the handler's pick) over `p` (bf16; p.movers >= 1 when p.tp > 1; p.slot_bytes
// = ag_slot_bytes(p.shape.T * 128, K, 2)) with `grid` CTAs on `stream`.
template <class Tr>
cudaError_t ag_tn_sm90_launch(const AgParams<bf16_t>& p, int grid, cudaStream_t stream);

// kosmos_ag_nn's Hopper builders: the pull kernel over gemm::Layout::NN (p.w
// [N, K], dX = AG(dY) @ w.T; ag_nn gathers by pull only), prepared beside
// ag_tn's by ag_tn_sm90_prepare.
bool ag_nn_sm90_ready(int ordinal);
cudaError_t ag_nn_sm90_launch(const AgParams<bf16_t>& p, int grid, cudaStream_t stream);

}  // namespace kosmos
