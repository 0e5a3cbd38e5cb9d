// Portable launcher of the MoE backward megakernel (csrc/moe_bwd_portable.cu,
// built for the library's architectures): kernels/moe/bwd_portable.cuh, the
// same schedule and workspace as the Hopper kernel on the portable tile
// engine, for every GPU that is not compute capability 9.0 and, with
// KOSMOS_FUSED_BUILDERS=portable, for those too. The FFI handler
// (moe_bwd_cuda.cu) checks the operands; this is preparation and launch.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "moe/bwd_portable.cuh"

namespace kosmos {

// Once per device: loads the kernel, pads its shared memory to one CTA per SM
// and checks that exactly one fits; "" or why not, naming the device.
std::string moe_bwd_portable_prepare(int ordinal);
// The megakernel over p (its workspace zeroed as moe_bwd_ws_layout says),
// `grid` CTAs, on `ordinal` (prepared, and current).
cudaError_t moe_bwd_portable_launch(const moe::MoeBwdPortableParams<bf16_t>& p, int grid, int ordinal,
                                    cudaStream_t stream);

}  // namespace kosmos
