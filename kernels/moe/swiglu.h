// The MoE GEMM1's activation, h = silu(gate) * up, on one pair of fp32
// pre-activations: one definition for both tile engines' epilogues (Hopper:
// moe/swiglu_sm90.cuh; portable: moe/fwd_portable.cuh), so the two differ only
// in their accumulators (wgmma's order of the k sums, or fp32 FMA in ascending k).
//
// The arithmetic is the pure-JAX twin's (reference/moe.py experts_forward):
// the pre-activations are rounded to bf16 first, as the twin stores h1 and the
// backward recomputes from it, so forward and backward see the same gate and
// up; then silu(g) * u in fp32, rounded once by the caller when it stores h.
#pragma once
#include "kosmos/platform.h"
#include "kosmos/types.h"

namespace kosmos::moe {

#ifdef KOSMOS_GPU
// 1 / d, correctly rounded, for d in [1, 2^125]. CUDA: rcp.approx and one
// Newton step, which is __frcp_rn's fast path without its slow-path branch
// and call (64 a thread a Hopper tile); d's range keeps it on that path.
// HIP: ocml's correctly rounded division.
KOSMOS_DEVICE float moe_rcp(float d) {
#if defined(KOSMOS_CUDA) && defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return fmaf(r, fmaf(-d, r, 1.0f), r);
#else
  return __frcp_rn(d);
#endif
}

// silu(g) * u = g * sigmoid(g) * u of two fp32 pre-activations, each rounded
// to bf16 first. e^-g by expf, not __expf: its error grows with |g| and would
// move more bf16 results off the twin's. 1 + e^-g is clamped to 2^125 (moe_rcp's
// range), which changes only g < -86.6 (|silu(g)| < 1e-35).
KOSMOS_DEVICE float moe_swiglu(float gate, float up) {
  const float g = to_f32(from_f32<bf16_t>(gate)), u = to_f32(from_f32<bf16_t>(up));
  const float d = fminf(1.0f + expf(-g), 0x1p125f);
  return g * moe_rcp(d) * u;
}

// The SwiGLU backward of one column: from da = dL/d(silu(g) * u) (fp32, the
// dgrad2 accumulator, not rounded) and the forward's bf16 pre-activations g, u
// (as fp32), *dg = da * u * s * (1 + g * (1 - s)) and *du = da * g * s with
// s = sigmoid(g): the twin's _swiglu_bwd, each rounded once by the caller.
KOSMOS_DEVICE void moe_swiglu_bwd(float da, float g, float u, float* dg, float* du) {
  const float s = moe_rcp(fminf(1.0f + expf(-g), 0x1p125f));
  *dg = da * u * s * (1.0f + g * (1.0f - s));
  *du = da * g * s;
}
#endif

}  // namespace kosmos::moe
