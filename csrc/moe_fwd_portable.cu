// Preparation and launch of the MoE forward megakernel with portable builders.
#include <atomic>

#include "launch.h"
#include "moe/fwd_portable.cuh"
#include "moe_fwd_portable.h"

namespace kosmos {
namespace {

// Per device: the padding found by prepare_persistent, valid once ready.
std::atomic<int> g_pad[kMaxOrdinals];
std::atomic<bool> g_ready[kMaxOrdinals];

}  // namespace

std::string moe_fwd_portable_prepare(int ordinal) {
  if (ordinal < 0 || ordinal >= kMaxOrdinals)
    return "kosmos_moe_forward (portable): device ordinal " + std::to_string(ordinal) + " is outside 0.." +
           std::to_string(kMaxOrdinals - 1);
  if (g_ready[ordinal]) return "";
  int pad = 0;
  const std::string err =
      prepare_persistent(reinterpret_cast<const void*>(&moe::moe_fwd_portable_kernel<bf16_t>), portable::kThreads,
                         sizeof(moe::MoePortableShared), ordinal, &pad);
  if (!err.empty()) return "kosmos_moe_forward (portable): " + err;
  g_pad[ordinal] = pad;
  g_ready[ordinal] = true;  // after the padding: a reader that sees ready reads it
  return "";
}

std::string moe_fwd_portable_unsupported(int H, int I, int E, int k) {
  return moe::moe_fwd_portable_unsupported(H, I, E, k);
}

void moe_fwd_portable_columns(int H, int I, int* nt1, int* nt2) {
  *nt1 = moe::moe_portable_nt1(I);
  *nt2 = moe::moe_portable_nt2(H);
}

cudaError_t moe_fwd_portable_launch(const moe::MoeFwdParams& m, const void* w1, const void* w2, const void* sw1,
                                    const void* sw2, int grid, int ordinal, cudaStream_t stream) {
  if (ordinal < 0 || ordinal >= kMaxOrdinals || !g_ready[ordinal]) return cudaErrorInitializationError;
  return moe::moe_fwd_portable_launch(m, w1, w2, sw1, sw2, grid, (size_t)g_pad[ordinal], stream);
}

}  // namespace kosmos
