// Element conversions the tile engines need (bf16 operands, bf16 or fp32
// outputs; the portable engine also takes f16 and fp32 operands), spelled once
// for CUDA and HIP: both runtimes name the intrinsics alike, only the type and
// header differ.
#pragma once
#include "kosmos/platform.h"

#if defined(KOSMOS_HIP)
#include <hip/hip_bf16.h>
#include <hip/hip_fp16.h>
namespace kosmos::gemm {
using bf16 = __hip_bfloat16;
using f16 = __half;
}
#elif defined(KOSMOS_CUDA)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
namespace kosmos::gemm {
using bf16 = __nv_bfloat16;
using f16 = __half;
}
#endif

#if defined(KOSMOS_GPU)
namespace kosmos::gemm {

KOSMOS_DEVICE float load_f32(const bf16* p) { return __bfloat162float(*p); }
KOSMOS_DEVICE float load_f32(const f16* p) { return __half2float(*p); }
KOSMOS_DEVICE float load_f32(const float* p) { return *p; }

KOSMOS_DEVICE void store_f32(float* p, float v) { *p = v; }
KOSMOS_DEVICE void store_f32(bf16* p, float v) { *p = __float2bfloat16(v); }
KOSMOS_DEVICE void store_f32(f16* p, float v) { *p = __float2half(v); }

// Two adjacent outputs in one store; p must be aligned to two elements.
KOSMOS_DEVICE void store_f32x2(float* p, float v0, float v1) { *reinterpret_cast<float2*>(p) = make_float2(v0, v1); }
KOSMOS_DEVICE void store_f32x2(bf16* p, float v0, float v1) {
#if defined(KOSMOS_CUDA)
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);  // one 4-byte store
#else
  p[0] = __float2bfloat16(v0);
  p[1] = __float2bfloat16(v1);
#endif
}

}  // namespace kosmos::gemm
#endif
