// The kernels the HIP code-generation check (tests/hip/hip_codegen.py) compiles
// for gfx90a, gfx942 and gfx950: every portable kernel, at fp32 and bf16 (the
// CUDA build also launches fp16, which shares the bf16 code paths but for the
// conversions; the MoE megakernels are bf16 only). One explicit instantiation a
// line; to add a kernel, include its header, add its lines here and its
// bounds in tests/hip/resource_bounds.txt
// (the check fails on a generated kernel without a bound), then run
// scripts/hip_check.sh and record the new rows in docs/hip.md.
#include "gemm/portable/tile_engine.cuh"
#include "moe/bwd_portable.cuh"
#include "moe/fwd_portable.cuh"
#include "tp/ag_gemm.cuh"
#include "tp/bulk_ag.cuh"
#include "tp/bulk_rs.cuh"
#include "tp/gemm_rs.cuh"

namespace kosmos {
// TP+SP forward: AG+GEMM and GEMM+RS (kernels/tp/ag_gemm.cuh, kernels/tp/gemm_rs.cuh).
template __global__ void ag_tn_kernel<float>(const AgParams<float>);
template __global__ void ag_tn_kernel<bf16_t>(const AgParams<bf16_t>);
template __global__ void tn_rs_kernel<float>(const RsParams<float>);
template __global__ void tn_rs_kernel<bf16_t>(const RsParams<bf16_t>);
// TP+SP backward: AG+NN and bulk AG || NN (kernels/tp/ag_gemm.cuh, kernels/tp/bulk_ag.cuh).
template __global__ void ag_nn_kernel<float>(const AgParams<float>);
template __global__ void ag_nn_kernel<bf16_t>(const AgParams<bf16_t>);
template __global__ void bulk_ag_nn_kernel<float>(const BulkAgParams<float>);
template __global__ void bulk_ag_nn_kernel<bf16_t>(const BulkAgParams<bf16_t>);
// TP+SP backward: bulk RS || NT (kernels/tp/bulk_rs.cuh).
template __global__ void bulk_rs_nt_kernel<float>(const BulkRsParams<float>);
template __global__ void bulk_rs_nt_kernel<bf16_t>(const BulkRsParams<bf16_t>);
}  // namespace kosmos

namespace kosmos::moe {
// The MoE forward megakernel at EP = 1, portable builders (kernels/moe/fwd_portable.cuh): bf16 only.
template __global__ void moe_fwd_portable_kernel<bf16_t>(const MoeFwdPortableParams<bf16_t>);
// Its backward megakernel, portable builders (kernels/moe/bwd_portable.cuh): bf16 only.
template __global__ void moe_bwd_portable_kernel<bf16_t>(const MoeBwdPortableParams<bf16_t>);
}  // namespace kosmos::moe

namespace kosmos::portable {
// The portable matmul engine's whole-GEMM kernel (kernels/gemm/portable/tile_engine.cuh).
template __global__ void portable_gemm<gemm::Layout::TN, float, float>(gemm::Problem);
template __global__ void portable_gemm<gemm::Layout::TN, bf16_t, bf16_t>(gemm::Problem);
template __global__ void portable_gemm<gemm::Layout::NN, bf16_t, bf16_t>(gemm::Problem);
template __global__ void portable_gemm<gemm::Layout::NT, bf16_t, bf16_t>(gemm::Problem);
}  // namespace kosmos::portable
