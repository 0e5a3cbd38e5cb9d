// Hopper-builder variant of kosmos_bulk_rs_nt (csrc/bulk_rs_nt_sm90.cu, built
// for sm_90a only): kernels/tp/bulk_rs_sm90.cuh. The FFI handler
// (bulk_rs_nt_cuda.cu) decides which builders run; this is preparation and launch.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "tp/bulk_rs.cuh"

namespace kosmos {

// Output tile width of the Hopper builders: BulkRsShape::tiles_n counts tiles of this.
int bulk_rs_nt_sm90_tile_n();

// Once per device at runtime init (not an error on a device that is not
// compute capability 9.0: bulk_rs_nt_sm90_ready() then says false).
std::string bulk_rs_nt_sm90_prepare(int ordinal);
bool bulk_rs_nt_sm90_ready(int ordinal);

// Launches over `p` (bf16; k and n multiples of 8, 16-byte aligned xg, dy and
// dw; p.shape's GEMM tiles of 128 x bulk_rs_nt_sm90_tile_n()) with `grid` CTAs.
cudaError_t bulk_rs_nt_sm90_launch(const BulkRsParams<bf16_t>& p, int grid, cudaStream_t stream);

}  // namespace kosmos
