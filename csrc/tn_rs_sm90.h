// Hopper-builder variant of kosmos_tn_rs (csrc/tn_rs_sm90.cu, built for sm_90a
// only): kernels/tp/gemm_rs_sm90.cuh. The FFI handler (tn_rs_cuda.cu) decides
// which builders run; this is only preparation and launch.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "tp/rs_ops.cuh"

namespace kosmos {

// Output tile width of the Hopper builders: RsShape::NT and RsParams::tile_n.
int tn_rs_sm90_tile_n();

// Once per device at runtime init; not an error on a device that is not compute
// capability 9.0 (tn_rs_sm90_ready() then says false).
std::string tn_rs_sm90_prepare(int ordinal);
bool tn_rs_sm90_ready(int ordinal);

// Launches the kernel of transport Tr (kosmos/pull.h Pull, kosmos/push.h Push
// or PushFold: the handler's pick) over `p` (bf16, rows % 128 == 0, tile_n =
// tn_rs_sm90_tile_n(), staging bf16 when p.stage_bf16 else fp32; PushFold:
// bf16 only) with `grid` CTAs on `stream`.
template <class Tr>
cudaError_t tn_rs_sm90_launch(const RsParams<bf16_t>& p, int grid, cudaStream_t stream);

}  // namespace kosmos
