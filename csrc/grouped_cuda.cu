// FFI handlers of the MoE expert GEMMs alone, one launch per GEMM over every
// expert at once on pre-permuted rows: the MoE benchmark's floor in both
// directions (kosmos_jax.testing.grouped_gemm; benchmark facilities, not ops).
// Hopper only: other GPUs are refused.
//
//   kosmos_grouped_gemm        C = A @ B[e]                 (forward GEMMs; kernels/moe/grouped_gemm_sm90.cuh)
//   kosmos_grouped_dgrad       C = A @ B[e]^T               (dgrad1; kernels/moe/grouped_bwd_sm90.cuh)
//   kosmos_grouped_swiglu_bwd  dh1 from dY @ W2[e]^T and h1 (dgrad2 with the SwiGLU backward)
//   kosmos_grouped_wgrad       C[e] = A[rows of e]^T @ B[rows of e]  (wgrad1, wgrad2)
//
// Outputs are poisoned first under KOSMOS_POISON_OUTPUT (launch.h), as every op's.
#include <cuda_runtime.h>

#include <string>

#include "device.h"
#include "ffi_util.h"
#include "handlers.h"
#include "launch.h"
#include "moe_bwd_sm90.h"
#include "moe_fwd_sm90.h"

namespace ffi = xla::ffi;

using namespace kosmos;
using namespace kosmos::ffi_util;

namespace {

// The grid of a Hopper-only facility on `ordinal`: "" or why not.
std::string hopper_grid(const char* op, int ordinal, int* grid) {
  bool sm90 = false;
  if (std::string why = grid_of(ordinal, 0, grid, &sm90); !why.empty()) return why;
  if (!sm90)
    return std::string("runs on compute capability 9.0 (H100/H200) only (the Hopper engine; a benchmark "
                       "facility); ordinal ") + std::to_string(ordinal) + " is another generation";
  return "";
}

bool all_bf16(std::initializer_list<ffi::DataType> types) {
  for (ffi::DataType t : types)
    if (t != ffi::DataType::BF16) return false;
  return true;
}

// Poisons `out` (KOSMOS_POISON_OUTPUT), then runs `launch` on ordinal's device.
template <class Launch>
ffi::Error run(const char* op, int ordinal, cudaStream_t stream, ffi::AnyBuffer out, const Launch& launch) {
  DeviceGuard guard(ordinal);
  if (guard.err != cudaSuccess) return CudaFail(op, "selecting the device", ordinal, guard.err);
  if (poison_output()) {
    if (cudaError_t e = cudaMemsetAsync(out.untyped_data(), 0xFF, out.size_bytes(), stream); e != cudaSuccess)
      return CudaFail(op, "poisoning the output", ordinal, e);
  }
  if (cudaError_t e = launch(); e != cudaSuccess) return CudaFail(op, "launch", ordinal, e);
  return ffi::Error::Success();
}

}  // namespace

static ffi::Error GroupedGemmCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer a, ffi::AnyBuffer b,
                                  ffi::AnyBuffer tile_expert, ffi::Result<ffi::AnyBuffer> c) {
  const char* op = "kosmos_grouped_gemm";
  auto ad = a.dimensions(), bd = b.dimensions(), td = tile_expert.dimensions();
  if (ad.size() != 2 || bd.size() != 3 || td.size() != 1 || bd[1] != ad[1])
    return Fail(op, "need a [M, K], b [E, K, N], tile_expert [M / 128]; got " + dims(ad) + ", " + dims(bd) + ", " + dims(td));
  const int64_t M = ad[0], K = ad[1], E = bd[0], N = bd[2];
  if (a.element_type() != ffi::DataType::BF16 || b.element_type() != ffi::DataType::BF16 ||
      c->element_type() != ffi::DataType::BF16 || tile_expert.element_type() != ffi::DataType::S32)
    return Fail(op, "a, b, c must be bf16 and tile_expert int32");
  if (M > INT32_MAX || K > INT32_MAX || N > INT32_MAX || td[0] * 128 != M || !shaped(c->dimensions(), {M, N}))
    return Fail(op, "M=" + std::to_string(M) + " must be 128 * len(tile_expert)=" + std::to_string(td[0]) +
                        " and c [M, N]; got c " + dims(c->dimensions()));
  if (std::string why = grouped_gemm_sm90_unsupported((int)M, (int)N, (int)K, (int)E); !why.empty()) return Fail(op, why);
  int grid = 0;
  if (std::string why = hopper_grid(op, ordinal, &grid); !why.empty()) return Fail(op, why);
  return run(op, ordinal, stream, *c, [&] {
    return grouped_gemm_sm90_launch(a.untyped_data(), b.untyped_data(), c->untyped_data(),
                                    static_cast<const int*>(tile_expert.untyped_data()), (int)M, (int)N, (int)K,
                                    (int)E, grid, stream);
  });
}

static ffi::Error GroupedDgradCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer a, ffi::AnyBuffer b,
                                   ffi::AnyBuffer tile_expert, ffi::Result<ffi::AnyBuffer> c) {
  const char* op = "kosmos_grouped_dgrad";
  auto ad = a.dimensions(), bd = b.dimensions(), td = tile_expert.dimensions();
  if (ad.size() != 2 || bd.size() != 3 || td.size() != 1 || bd[2] != ad[1])
    return Fail(op, "need a [M, K], b [E, N, K], tile_expert [M / 128]; got " + dims(ad) + ", " + dims(bd) + ", " + dims(td));
  const int64_t M = ad[0], K = ad[1], E = bd[0], N = bd[1];
  if (!all_bf16({a.element_type(), b.element_type(), c->element_type()}) ||
      tile_expert.element_type() != ffi::DataType::S32)
    return Fail(op, "a, b, c must be bf16 and tile_expert int32");
  if (M > INT32_MAX || E * N > INT32_MAX || K > INT32_MAX || td[0] * 128 != M || !shaped(c->dimensions(), {M, N}))
    return Fail(op, "M=" + std::to_string(M) + " must be 128 * len(tile_expert)=" + std::to_string(td[0]) +
                        " and c [M, N]; got c " + dims(c->dimensions()));
  if (std::string why = grouped_dgrad_sm90_unsupported((int)M, (int)N, (int)K, (int)E); !why.empty()) return Fail(op, why);
  int grid = 0;
  if (std::string why = hopper_grid(op, ordinal, &grid); !why.empty()) return Fail(op, why);
  return run(op, ordinal, stream, *c, [&] {
    return grouped_dgrad_sm90_launch(a.untyped_data(), b.untyped_data(), c->untyped_data(),
                                     static_cast<const int*>(tile_expert.untyped_data()), (int)M, (int)N, (int)K,
                                     (int)E, grid, stream);
  });
}

static ffi::Error GroupedSwigluBwdCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer dy, ffi::AnyBuffer w2,
                                       ffi::AnyBuffer h1, ffi::AnyBuffer tile_expert, ffi::Result<ffi::AnyBuffer> dh1) {
  const char* op = "kosmos_grouped_swiglu_bwd";
  auto dd = dy.dimensions(), wd = w2.dimensions(), hd = h1.dimensions(), td = tile_expert.dimensions();
  if (dd.size() != 2 || wd.size() != 3 || hd.size() != 2 || td.size() != 1 || wd[2] != dd[1] ||
      !shaped(hd, {dd[0], 2 * wd[1]}))
    return Fail(op, "need dy [M, H], w2 [E, I, H], h1 [M, 2I], tile_expert [M / 128]; got " + dims(dd) + ", " +
                        dims(wd) + ", " + dims(hd) + ", " + dims(td));
  const int64_t M = dd[0], H = dd[1], E = wd[0], I = wd[1];
  if (!all_bf16({dy.element_type(), w2.element_type(), h1.element_type(), dh1->element_type()}) ||
      tile_expert.element_type() != ffi::DataType::S32)
    return Fail(op, "dy, w2, h1, dh1 must be bf16 and tile_expert int32");
  if (M > INT32_MAX || E * I > INT32_MAX || H > INT32_MAX || td[0] * 128 != M || !shaped(dh1->dimensions(), {M, 2 * I}))
    return Fail(op, "M=" + std::to_string(M) + " must be 128 * len(tile_expert)=" + std::to_string(td[0]) +
                        " and dh1 [M, 2I]; got dh1 " + dims(dh1->dimensions()));
  if (std::string why = grouped_dgrad_sm90_unsupported((int)M, (int)I, (int)H, (int)E); !why.empty())
    return Fail(op, why + " (N = I=" + std::to_string(I) + ", K = H=" + std::to_string(H) + ")");
  int grid = 0;
  if (std::string why = hopper_grid(op, ordinal, &grid); !why.empty()) return Fail(op, why);
  return run(op, ordinal, stream, *dh1, [&] {
    return grouped_swiglu_bwd_sm90_launch(dy.untyped_data(), w2.untyped_data(), h1.untyped_data(), dh1->untyped_data(),
                                          static_cast<const int*>(tile_expert.untyped_data()), (int)M, (int)I, (int)H,
                                          (int)E, grid, stream);
  });
}

static ffi::Error GroupedWgradCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer a, ffi::AnyBuffer b,
                                   ffi::AnyBuffer expert_rb, ffi::Result<ffi::AnyBuffer> c) {
  const char* op = "kosmos_grouped_wgrad";
  auto ad = a.dimensions(), bd = b.dimensions(), rd = expert_rb.dimensions();
  if (ad.size() != 2 || bd.size() != 2 || rd.size() != 1 || rd[0] < 2 || bd[0] != ad[0])
    return Fail(op, "need a [R, P], b [R, Q], expert_rb [E + 1]; got " + dims(ad) + ", " + dims(bd) + ", " + dims(rd));
  const int64_t R = ad[0], P = ad[1], Q = bd[1], E = rd[0] - 1;
  if (!all_bf16({a.element_type(), b.element_type(), c->element_type()}) ||
      expert_rb.element_type() != ffi::DataType::S32)
    return Fail(op, "a, b, c must be bf16 and expert_rb int32");
  if (R > INT32_MAX || E * P > INT32_MAX || Q > INT32_MAX || !shaped(c->dimensions(), {E, P, Q}))
    return Fail(op, "c must be [E, P, Q] = [" + std::to_string(E) + ", " + std::to_string(P) + ", " +
                        std::to_string(Q) + "]; got " + dims(c->dimensions()));
  if (std::string why = grouped_wgrad_sm90_unsupported((int)R, (int)P, (int)Q, (int)E); !why.empty()) return Fail(op, why);
  int grid = 0;
  if (std::string why = hopper_grid(op, ordinal, &grid); !why.empty()) return Fail(op, why);
  return run(op, ordinal, stream, *c, [&] {
    return grouped_wgrad_sm90_launch(a.untyped_data(), b.untyped_data(), c->untyped_data(),
                                     static_cast<const int*>(expert_rb.untyped_data()), (int)R, (int)P, (int)Q,
                                     (int)E, grid, stream);
  });
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_grouped_gemm_cuda, GroupedGemmCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()    // a [M, K] bf16, rows expert-major, segments of 128
                                  .Arg<ffi::AnyBuffer>()    // b [E, K, N] bf16
                                  .Arg<ffi::AnyBuffer>()    // tile_expert [M / 128] int32
                                  .Ret<ffi::AnyBuffer>());  // c [M, N] bf16

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_grouped_dgrad_cuda, GroupedDgradCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()    // a [M, K] bf16, rows expert-major, segments of 128
                                  .Arg<ffi::AnyBuffer>()    // b [E, N, K] bf16
                                  .Arg<ffi::AnyBuffer>()    // tile_expert [M / 128] int32
                                  .Ret<ffi::AnyBuffer>());  // c [M, N] bf16

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_grouped_swiglu_bwd_cuda, GroupedSwigluBwdCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()    // dy [M, H] bf16, rows expert-major, segments of 128
                                  .Arg<ffi::AnyBuffer>()    // w2 [E, I, H] bf16
                                  .Arg<ffi::AnyBuffer>()    // h1 [M, 2I] bf16 (gate | up pre-activations)
                                  .Arg<ffi::AnyBuffer>()    // tile_expert [M / 128] int32
                                  .Ret<ffi::AnyBuffer>());  // dh1 [M, 2I] bf16

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_grouped_wgrad_cuda, GroupedWgradCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()    // a [R, P] bf16, rows expert-major, segments of 128
                                  .Arg<ffi::AnyBuffer>()    // b [R, Q] bf16
                                  .Arg<ffi::AnyBuffer>()    // expert_rb [E + 1] int32 row-block bounds
                                  .Ret<ffi::AnyBuffer>());  // c [E, P, Q] bf16
