// Preparation and launch of the MoE forward megakernel with portable builders.
#include "launch.h"
#include "moe/fwd_portable.cuh"
#include "moe_fwd_portable.h"

namespace kosmos {
namespace {

PersistentKernel g_kernel(reinterpret_cast<const void*>(&moe::moe_fwd_portable_kernel<bf16_t>), portable::kThreads,
                          sizeof(moe::MoePortableShared), "kosmos_moe_forward (portable)");

}  // namespace

std::string moe_fwd_portable_prepare(int ordinal) { return g_kernel.prepare(ordinal); }

std::string moe_fwd_portable_unsupported(int H, int I, int E, int k) {
  return moe::moe_fwd_portable_unsupported(H, I, E, k);
}

void moe_fwd_portable_columns(int H, int I, int* nt1, int* nt2) {
  *nt1 = moe::moe_portable_nt1(I);
  *nt2 = moe::moe_portable_nt2(H);
}

cudaError_t moe_fwd_portable_launch(const moe::MoeFwdParams& m, const void* w1, const void* w2, const void* sw1,
                                    const void* sw2, int grid, int ordinal, cudaStream_t stream) {
  const int pad = g_kernel.padding(ordinal);
  if (pad < 0) return cudaErrorInitializationError;
  return moe::moe_fwd_portable_launch(m, w1, w2, sw1, sw2, grid, (size_t)pad, stream);
}

}  // namespace kosmos
