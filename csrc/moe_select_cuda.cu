// FFI handler of the MoE routing's expert selection (kernels/moe/select.cuh):
// idx [t, k] = moe_router.select's ids from the scores XLA computed, without
// XLA's sorts. Any CUDA GPU. Outputs are poisoned first under
// KOSMOS_POISON_OUTPUT (launch.h), as every op's.
#include <cuda_runtime.h>

#include <string>

#include "device.h"
#include "ffi_util.h"
#include "handlers.h"
#include "launch.h"
#include "moe/select.cuh"

namespace ffi = xla::ffi;

using namespace kosmos;
using namespace kosmos::ffi_util;

static ffi::Error MoeSelectCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer score, ffi::AnyBuffer bias,
                                ffi::Result<ffi::AnyBuffer> idx, int64_t top_k, int64_t n_groups,
                                int64_t topk_groups, int64_t has_bias) {
  const char* op = "kosmos_moe_select";
  auto sd = score.dimensions(), bd = bias.dimensions();
  if (sd.size() != 2 || bd.size() != 1 || score.element_type() != ffi::DataType::F32 ||
      bias.element_type() != ffi::DataType::F32 || idx->element_type() != ffi::DataType::S32)
    return Fail(op, "need score [t, E] f32, bias [E] (or [1] without a bias) f32 and int32 ids; got score " +
                        dims(sd) + ", bias " + dims(bd));
  const int64_t t = sd[0], E = sd[1];
  if (t > INT32_MAX / 32 || !shaped(idx->dimensions(), {t, top_k}) || (has_bias && bd[0] != E))
    return Fail(op, "t=" + std::to_string(t) + ", E=" + std::to_string(E) + ", top_k=" + std::to_string(top_k) +
                        ": ids must be [t, top_k] (got " + dims(idx->dimensions()) + ") and a bias [E] (got " +
                        dims(bd) + ")");
  moe::RouteConfig c{moe::Score::kSoftmax, (int)E, (int)top_k, (int)n_groups, (int)topk_groups, false, 1.f,
                     has_bias != 0};
  if (E > moe::kMaxExperts || !moe::route_config_ok(c))
    return Fail(op, "E=" + std::to_string(E) + ", top_k=" + std::to_string(top_k) + ", n_groups=" +
                        std::to_string(n_groups) + ", topk_groups=" + std::to_string(topk_groups) +
                        " is no routing rule (E <= " + std::to_string(moe::kMaxExperts) +
                        ", n_groups divides E, topk_groups <= n_groups, top_k <= topk_groups * E / n_groups)");
  DeviceGuard guard(ordinal);
  if (guard.err != cudaSuccess) return CudaFail(op, "selecting the device", ordinal, guard.err);
  if (poison_output()) {
    if (cudaError_t e = cudaMemsetAsync(idx->untyped_data(), 0xFF, idx->size_bytes(), stream); e != cudaSuccess)
      return CudaFail(op, "poisoning the output", ordinal, e);
  }
  if (t == 0) return ffi::Error::Success();
  const int grid = (int)((t + moe::kSelectTokensPerCta - 1) / moe::kSelectTokensPerCta);
  moe::moe_select_kernel<<<grid, moe::kSelectThreads, 0, stream>>>(static_cast<const float*>(score.untyped_data()),
                                                                  static_cast<const float*>(bias.untyped_data()), c,
                                                                  (int)t, static_cast<int*>(idx->untyped_data()));
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return CudaFail(op, "launch", ordinal, e);
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_moe_select_cuda, MoeSelectCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()  // score [t, E] f32
                                  .Arg<ffi::AnyBuffer>()  // bias [E] f32, or [1] (has_bias = 0)
                                  .Ret<ffi::AnyBuffer>()  // idx [t, top_k] int32, best first
                                  .Attr<int64_t>("top_k")
                                  .Attr<int64_t>("n_groups")
                                  .Attr<int64_t>("topk_groups")
                                  .Attr<int64_t>("has_bias"));
