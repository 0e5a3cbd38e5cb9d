// Portable launcher of the MoE forward megakernel (csrc/moe_fwd_portable.cu,
// built for the library's architectures): kernels/moe/fwd_portable.cuh, the
// same schedule and workspace as the Hopper kernel on the portable tile
// engine, for every GPU that is not compute capability 9.0 and, with
// KOSMOS_FUSED_BUILDERS=portable, for those too. The FFI handler
// (moe_fwd_cuda.cu) checks the operands; this is preparation and launch.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "moe/fwd_ops.cuh"

namespace kosmos {

// Once per device: loads the kernel, pads its shared memory to one CTA per SM
// and checks that exactly one fits; "" or why not, naming the device.
std::string moe_fwd_portable_prepare(int ordinal);
// "" when the portable megakernel runs this shape, else why not.
std::string moe_fwd_portable_unsupported(int H, int I, int E, int k);
// Column blocks per row block of GEMM1 (of I) and GEMM2 (of H): MoeFwdShape's nt1, nt2.
void moe_fwd_portable_columns(int H, int I, int* nt1, int* nt2);
// The megakernel over m (workspace zeroed as moe_ws_layout says), `grid` CTAs,
// on `ordinal` (prepared, and current).
// sw1 / sw2: the shared expert's weights (m.s.shared_blocks > 0), else unread.
cudaError_t moe_fwd_portable_launch(const moe::MoeFwdParams& m, const void* w1, const void* w2, const void* sw1,
                                    const void* sw2, int grid, int ordinal, cudaStream_t stream);

}  // namespace kosmos
