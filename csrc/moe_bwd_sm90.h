// Hopper launchers of the MoE backward (csrc/moe_bwd_sm90.cu, built for sm_90a
// only): its megakernel (kernels/moe/bwd_sm90.cuh) and its expert GEMMs alone
// (kernels/moe/grouped_bwd_sm90.cuh: the backward's floor, one launch per GEMM
// over every expert at once). The FFI handlers (moe_bwd_cuda.cu,
// grouped_cuda.cu) check the operands; this is preparation and launch.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "moe/fwd_ctl.cuh"

namespace kosmos {

// The backward megakernel (kernels/moe/bwd_sm90.cuh). Once per device, on the
// first call there: "" when ready or the device is not compute capability 9.0
// (moe_bwd_sm90_ready then says false).
std::string moe_bwd_sm90_prepare(int ordinal);
bool moe_bwd_sm90_ready(int ordinal);
// "" when the Hopper megakernel runs this shape, else why not.
std::string moe_bwd_sm90_unsupported(int H, int I, int E, int k);
// Column blocks per row block of dgrad2 (of I) and dgrad1 (of H): the shape's nt1, nt2.
void moe_bwd_sm90_columns(int H, int I, int* nt1, int* nt2);
// The megakernel over m (workspace zeroed as moe_bwd_ws_layout says), `grid` CTAs.
cudaError_t moe_bwd_sm90_launch(const moe::MoeFwdParams& m, const void* w1, const void* w2, const void* x_rows,
                                const void* act, const void* h1, void* dh1, void* dw1, void* dw2, const void* x,
                                const void* hs, const void* sw1, const void* sw2, void* dsw1, void* dsw2, int grid,
                                cudaStream_t stream);

// dgrad: C [M, N] = A [M, K] @ B[tile_expert[m / 128]]^T, B [E, N, K]; "" or why not.
std::string grouped_dgrad_sm90_unsupported(int M, int N, int K, int E);
cudaError_t grouped_dgrad_sm90_launch(const void* a, const void* b, void* c, const int* tile_expert, int M, int N,
                                      int K, int E, int grid, cudaStream_t stream);
// dgrad2 with the SwiGLU backward: dh1 [M, 2I] from dy [M, H], w2 [E, I, H], h1 [M, 2I].
cudaError_t grouped_swiglu_bwd_sm90_launch(const void* dy, const void* w2, const void* h1, void* dh1,
                                           const int* tile_expert, int M, int I, int H, int E, int grid,
                                           cudaStream_t stream);
// wgrad: C [E, P, Q], C[e] = A[rows of e]^T @ B[rows of e]; A [R, P], B [R, Q],
// expert_rb [E + 1] (row blocks of 128); "" or why not.
std::string grouped_wgrad_sm90_unsupported(int R, int P, int Q, int E);
cudaError_t grouped_wgrad_sm90_launch(const void* a, const void* b, void* c, const int* expert_rb, int R, int P, int Q,
                                      int E, int grid, cudaStream_t stream);

}  // namespace kosmos
