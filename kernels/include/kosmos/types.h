// Element types the kernels instantiate (fp32, fp16, bf16) and their fp32
// conversions, spelled once for CUDA and HIP.
#pragma once
#include "kosmos/platform.h"

#if defined(KOSMOS_CUDA)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
namespace kosmos {
using half_t = __half;
using bf16_t = __nv_bfloat16;
}  // namespace kosmos
#elif defined(KOSMOS_HIP)
#include <hip/hip_fp16.h>
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>
namespace kosmos {
using bf16_t = __hip_bfloat16;
}  // namespace kosmos
#else
// ROCm before 5.7 (Debian ships 5.2) has only the older class type, which
// converts through its own operators; KOSMOS_HIP_LEGACY_BF16 selects them below.
#include <hip/hip_bfloat16.h>
#define KOSMOS_HIP_LEGACY_BF16 1
namespace kosmos {
using bf16_t = hip_bfloat16;
}  // namespace kosmos
#endif
namespace kosmos {
using half_t = __half;
}  // namespace kosmos
#endif

#ifdef KOSMOS_GPU
namespace kosmos {

KOSMOS_DEVICE float to_f32(float x) { return x; }
KOSMOS_DEVICE float to_f32(half_t x) { return __half2float(x); }
#ifdef KOSMOS_HIP_LEGACY_BF16
KOSMOS_DEVICE float to_f32(bf16_t x) { return static_cast<float>(x); }
#else
KOSMOS_DEVICE float to_f32(bf16_t x) { return __bfloat162float(x); }
#endif

template <typename T>
KOSMOS_DEVICE T from_f32(float x);
template <>
KOSMOS_DEVICE float from_f32<float>(float x) { return x; }
template <>
KOSMOS_DEVICE half_t from_f32<half_t>(float x) { return __float2half_rn(x); }
#ifdef KOSMOS_HIP_LEGACY_BF16
template <>
KOSMOS_DEVICE bf16_t from_f32<bf16_t>(float x) { return bf16_t(x); }  // rounds to nearest even
#else
template <>
KOSMOS_DEVICE bf16_t from_f32<bf16_t>(float x) { return __float2bfloat16_rn(x); }
#endif

// L2-only scalar load (see transport.h: rows written by movers of this kernel).
template <typename T>
KOSMOS_DEVICE T load_cg_elem(const T* p) {
#if defined(KOSMOS_CUDA)
  if constexpr (sizeof(T) == 4) {
    const unsigned v = __ldcg(reinterpret_cast<const unsigned*>(p));
    return *reinterpret_cast<const T*>(&v);
  } else {
    const unsigned short v = __ldcg(reinterpret_cast<const unsigned short*>(p));
    return *reinterpret_cast<const T*>(&v);
  }
#else
  return *p;
#endif
}

}  // namespace kosmos
#endif  // KOSMOS_GPU
