// Stand-in for ROCm >= 5.7's <hip/hip_bf16.h>, for the HIP code-generation check
// only (tests/hip/hip_codegen.py puts this folder on -idirafter, so a ROCm that
// has the real header always wins). Debian's HIP 5.2 has only the older
// hip_bfloat16 class; the user's MI300X/MI355X ROCm (6.x and later) has
// __hip_bfloat16, which kernels/gemm/elem.h includes unconditionally. This maps
// the part of that API the kernels call onto the 5.2 class: the same 16 bits,
// the same round-to-nearest-even conversion (hip_bfloat16::round_to_bfloat16),
// so the generated code is what the newer header's inline conversions produce
// up to instruction choice. Not installed, not used by any build of the library.
#pragma once
#include <hip/hip_bfloat16.h>

using __hip_bfloat16 = hip_bfloat16;

__host__ __device__ inline float __bfloat162float(__hip_bfloat16 x) { return static_cast<float>(x); }
__host__ __device__ inline __hip_bfloat16 __float2bfloat16(float f) { return hip_bfloat16::round_to_bfloat16(f); }
__host__ __device__ inline __hip_bfloat16 __float2bfloat16_rn(float f) { return hip_bfloat16::round_to_bfloat16(f); }
