// XLA FFI handler symbols exported by the extension; csrc/module.cc hands them to
// Python as capsules for jax.ffi.register_ffi_target.
#pragma once
#include "xla/ffi/api/ffi.h"

#ifdef KOSMOS_WITH_CUDA
// kosmos_ag_tn: y = allgather_rows(x) @ w, fused (kernels/tp/ag_gemm.cuh).
XLA_FFI_DECLARE_HANDLER_SYMBOL(kosmos_ag_tn_cuda);
// kosmos_matmul: one GEMM in layout TN, NN or NT (kernels/gemm; csrc/matmul_cuda.cu).
XLA_FFI_DECLARE_HANDLER_SYMBOL(kosmos_matmul_cuda);
// kosmos_tn_rs: y = reduce_scatter_rows(x @ w), fused (kernels/tp/gemm_rs.cuh).
XLA_FFI_DECLARE_HANDLER_SYMBOL(kosmos_tn_rs_cuda);
// kosmos_ag_nn: dx = allgather_rows(dy) @ w.T and allgather_rows(dy), fused (kernels/tp/ag_gemm.cuh).
XLA_FFI_DECLARE_HANDLER_SYMBOL(kosmos_ag_nn_cuda);
// kosmos_bulk_ag_nn: allgather_rows(x) beside dy @ w.T, fused (kernels/tp/bulk_ag.cuh).
XLA_FFI_DECLARE_HANDLER_SYMBOL(kosmos_bulk_ag_nn_cuda);
// kosmos_bulk_rs_nt: reduce_scatter_rows(dx_partial) beside x_gathered.T @ dy, fused (kernels/tp/bulk_rs.cuh).
XLA_FFI_DECLARE_HANDLER_SYMBOL(kosmos_bulk_rs_nt_cuda);
// kosmos_moe_forward: the MoE layer's forward in one launch (EP = 1, or an EP group
// through the symmetric heap): plan, dispatch, GEMM1 + SwiGLU, GEMM2, combine, fold
// (kernels/moe/fwd_sched.h; contract: kosmos_jax/ops/_fused_moe.py).
XLA_FFI_DECLARE_HANDLER_SYMBOL(kosmos_moe_forward_cuda);
// kosmos_moe_backward: the MoE layer's backward at EP = 1 in one launch: plan, gather dY,
// dgrad2 + SwiGLU backward, dgrad1, wgrads, fold of dX (kernels/moe/bwd_sm90.cuh;
// contract: kosmos_jax/ops/_fused_moe_bwd.py).
XLA_FFI_DECLARE_HANDLER_SYMBOL(kosmos_moe_backward_cuda);
// kosmos_moe_select: the MoE routing's top-k ids from XLA's scores, without its sorts
// (kernels/moe/select.cuh; contract: kosmos_jax/ops/_fused_moe.py select_experts).
XLA_FFI_DECLARE_HANDLER_SYMBOL(kosmos_moe_select_cuda);
// The MoE expert GEMMs alone, every expert's rows at once: the MoE benchmark's floor
// (kosmos_jax.testing.grouped_gemm; csrc/grouped_cuda.cu). kosmos_grouped_gemm: C = A @ B[e];
// kosmos_grouped_dgrad: C = A @ B[e]^T; kosmos_grouped_swiglu_bwd: dgrad2 with the SwiGLU
// backward; kosmos_grouped_wgrad: C[e] = A[rows of e]^T @ B[rows of e].
XLA_FFI_DECLARE_HANDLER_SYMBOL(kosmos_grouped_gemm_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kosmos_grouped_dgrad_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kosmos_grouped_swiglu_bwd_cuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kosmos_grouped_wgrad_cuda);
#endif
