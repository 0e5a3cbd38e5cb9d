#include <cuda_runtime.h>

#include "launch.h"
#include "runtime.h"

namespace kosmos {

std::string find_group(const char* op, int ordinal, xla::ffi::Span<const int64_t> groups, int64_t tp,
                       GroupInfo* out) {
  DeviceEntry me;
  if (!Runtime::get().local(ordinal, &me))
    return std::string(op) + ": no symmetric heap on device ordinal " + std::to_string(ordinal) +
           " (kosmos_jax.runtime.init() was not run in this process)";
  if (tp < 1 || tp > kMaxRanks || groups.size() % tp)
    return std::string(op) + ": group size " + std::to_string(tp) + " must be 1.." + std::to_string(kMaxRanks) +
           " and divide the " + std::to_string(groups.size()) + " group ids";
  for (size_t base = 0; base < groups.size(); base += tp) {
    for (int64_t r = 0; r < tp; ++r)
      if (groups[base + r] == me.global_id) out->rank = (int)r;
    if (out->rank < 0) continue;
    for (int64_t r = 0; r < tp; ++r) {
      std::string why;
      out->heaps[r] = Runtime::get().heap_for(ordinal, groups[base + r], &why);
      if (!out->heaps[r]) return std::string(op) + ": device " + std::to_string(me.global_id) + ": " + why;
    }
    out->row = (int)(base / tp);
    out->sm_count = me.sm_count;
    out->heap_bytes = me.heap_bytes;
    return "";
  }
  return std::string(op) + ": device " + std::to_string(me.global_id) + " is in none of the groups";
}

std::string prepare_persistent(const void* kernel, int threads, size_t static_smem, int ordinal, int* dyn_smem) {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(ordinal);
  auto fail = [&](const char* what, cudaError_t e) {
    cudaSetDevice(prev);
    return std::string(what) + " on ordinal " + std::to_string(ordinal) + ": " + cudaGetErrorString(e);
  };
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, kernel);  // loads the module eagerly
  if (e != cudaSuccess) return fail("cudaFuncGetAttributes", e);
  int per_sm = 0, optin = 0;
  cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, ordinal);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal);
  // More than half an SM's shared memory per CTA: a second CTA can never co-reside.
  long want = (long)per_sm / 2 + 1024 - (long)static_smem;
  if (want < 0) want = 0;
  if (want + (long)static_smem > optin) want = optin - (long)static_smem;
  if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)want)) != cudaSuccess)
    return fail("cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", e);
  int blocks = 0;
  if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, want)) != cudaSuccess)
    return fail("cudaOccupancyMaxActiveBlocksPerMultiprocessor", e);
  cudaSetDevice(prev);
  if (blocks != 1)
    return "persistent kernel: occupancy query says " + std::to_string(blocks) +
           " CTAs per SM on ordinal " + std::to_string(ordinal) + ", need exactly 1";
  *dyn_smem = (int)want;
  return "";
}

}  // namespace kosmos
