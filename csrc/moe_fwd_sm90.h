// Hopper launchers of the MoE ops (csrc/moe_fwd_sm90.cu, built for sm_90a
// only): the forward megakernel (kernels/moe/fwd_sm90.cuh) and the expert
// GEMMs alone (kernels/moe/grouped_gemm_sm90.cuh, the benchmark's floor). The
// FFI handlers (moe_fwd_cuda.cu) check the operands; this is preparation and launch.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "moe/fwd_ops.cuh"

namespace kosmos {

// Once per device, on the first call there: "" when the kernel is ready or the
// device is not compute capability 9.0 (moe_fwd_sm90_ready then says false).
std::string moe_fwd_sm90_prepare(int ordinal);
bool moe_fwd_sm90_ready(int ordinal);
// "" when the Hopper megakernel runs this shape, else why not.
std::string moe_fwd_sm90_unsupported(int H, int I, int E, int k);
// Column blocks per row block of GEMM1 (of I) and GEMM2 (of H): MoeFwdShape's nt1, nt2.
void moe_fwd_sm90_columns(int H, int I, int* nt1, int* nt2);
// The megakernel over m (workspace zeroed as moe_ws_layout says), `grid` CTAs.
cudaError_t moe_fwd_sm90_launch(const moe::MoeFwdParams& m, const void* w1, const void* w2, const void* sw1,
                                const void* sw2, int grid, cudaStream_t stream);
// C [M, N] = A [M, K] @ B[tile_expert[m / 128]] ([E, K, N]), every expert at once; "" or why not.
std::string grouped_gemm_sm90_unsupported(int M, int N, int K, int E);
cudaError_t grouped_gemm_sm90_launch(const void* a, const void* b, void* c, const int* tile_expert, int M, int N,
                                     int K, int E, int grid, cudaStream_t stream);

}  // namespace kosmos
