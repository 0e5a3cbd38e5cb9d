// Preparation and launch of the MoE backward megakernel with portable builders.
#include "launch.h"
#include "moe_bwd_portable.h"

namespace kosmos {
namespace {

PersistentKernel g_kernel(reinterpret_cast<const void*>(&moe::moe_bwd_portable_kernel<bf16_t>), portable::kThreads,
                          sizeof(moe::MoePortableShared), "kosmos_moe_backward (portable)");

}  // namespace

std::string moe_bwd_portable_prepare(int ordinal) { return g_kernel.prepare(ordinal); }

cudaError_t moe_bwd_portable_launch(const moe::MoeBwdPortableParams<bf16_t>& p, int grid, int ordinal,
                                    cudaStream_t stream) {
  const int pad = g_kernel.padding(ordinal);
  if (pad < 0) return cudaErrorInitializationError;
  return moe::moe_bwd_portable_launch(p, grid, (size_t)pad, stream);
}

}  // namespace kosmos
