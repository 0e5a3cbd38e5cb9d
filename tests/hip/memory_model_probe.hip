// One kernel per flag/atomic mapping of kosmos/platform.h, for
// tests/test_hip_memory_model.py: each kernel does one plain data store (where
// the mapping orders data) and the mapping itself, so the test can read the
// cache-control sequence the AMDGPU memory model gives each one.
#include "kosmos/platform.h"

using namespace kosmos;

extern "C" __global__ void mm_ld_acquire_sys(const uint64_t* flag, uint64_t* out) { *out = ld_acquire_sys(flag); }
extern "C" __global__ void mm_ld_acquire_gpu(const uint64_t* flag, uint64_t* out) { *out = ld_acquire_gpu(flag); }
extern "C" __global__ void mm_st_release_sys(uint64_t* data, uint64_t* flag) {
  *data = 1;
  st_release_sys(flag, 2);
}
extern "C" __global__ void mm_st_release_gpu(uint64_t* data, uint64_t* flag) {
  *data = 1;
  st_release_gpu(flag, 2);
}
extern "C" __global__ void mm_claim_u32(uint32_t* next, uint32_t* out) { *out = claim_u32(next); }
extern "C" __global__ void mm_ld_relaxed_u32(const uint32_t* p, uint32_t* out) { *out = ld_relaxed_u32(p); }
extern "C" __global__ void mm_add_acq_rel_gpu_u32(uint64_t* data, uint32_t* count, uint32_t* out) {
  *data = 1;
  *out = add_acq_rel_gpu_u32(count, 1);
}
extern "C" __global__ void mm_now_ns(uint64_t* out) { *out = now_ns(); }
extern "C" __global__ void mm_trap() { trap(); }
