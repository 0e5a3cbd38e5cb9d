// Preparation and launch of the MoE backward megakernel with portable builders.
#include <atomic>

#include "launch.h"
#include "moe_bwd_portable.h"

namespace kosmos {
namespace {

// Per device: the padding found by prepare_persistent, valid once ready.
std::atomic<int> g_pad[kMaxOrdinals];
std::atomic<bool> g_ready[kMaxOrdinals];

}  // namespace

std::string moe_bwd_portable_prepare(int ordinal) {
  if (ordinal < 0 || ordinal >= kMaxOrdinals)
    return "kosmos_moe_backward (portable): device ordinal " + std::to_string(ordinal) + " is outside 0.." +
           std::to_string(kMaxOrdinals - 1);
  if (g_ready[ordinal]) return "";
  int pad = 0;
  const std::string err =
      prepare_persistent(reinterpret_cast<const void*>(&moe::moe_bwd_portable_kernel<bf16_t>), portable::kThreads,
                         sizeof(moe::MoePortableShared), ordinal, &pad);
  if (!err.empty()) return "kosmos_moe_backward (portable): " + err;
  g_pad[ordinal] = pad;
  g_ready[ordinal] = true;  // after the padding: a reader that sees ready reads it
  return "";
}

cudaError_t moe_bwd_portable_launch(const moe::MoeBwdPortableParams<bf16_t>& p, int grid, int ordinal,
                                    cudaStream_t stream) {
  if (ordinal < 0 || ordinal >= kMaxOrdinals || !g_ready[ordinal]) return cudaErrorInitializationError;
  return moe::moe_bwd_portable_launch(p, grid, (size_t)g_pad[ordinal], stream);
}

}  // namespace kosmos
