// Hopper-builder variant of kosmos_bulk_ag_nn (csrc/bulk_ag_nn_sm90.cu, built
// for sm_90a only): kernels/tp/bulk_ag_sm90.cuh. The FFI handler
// (bulk_ag_nn_cuda.cu) decides which builders run; this is preparation and launch.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "tp/bulk_ag.cuh"

namespace kosmos {

// Once per device at runtime init (not an error on a device that is not
// compute capability 9.0: bulk_ag_nn_sm90_ready() then says false).
std::string bulk_ag_nn_sm90_prepare(int ordinal);
bool bulk_ag_nn_sm90_ready(int ordinal);
// Launches over `q` (bf16; q.ag.movers >= 1 when q.ag.tp > 1) with `grid` CTAs.
cudaError_t bulk_ag_nn_sm90_launch(const BulkAgParams<bf16_t>& q, int grid, cudaStream_t stream);

}  // namespace kosmos
