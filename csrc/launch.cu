#include <cuda_runtime.h>

#include <cstdlib>

#include "gemm/portable/tile_engine.cuh"
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
    out->all_local = true;
    for (int64_t r = 0; r < tp; ++r) out->all_local = out->all_local && Runtime::get().is_local(groups[base + r]);
    out->row = (int)(base / tp);
    out->sm_count = me.sm_count;
    out->heap_bytes = me.heap_bytes;
    return "";
  }
  return std::string(op) + ": device " + std::to_string(me.global_id) + " is in none of the groups";
}

bool peers_read_directly(const GroupInfo& g, const void* p) {
  if (!g.all_local) return false;
  // The driver's cuPointerGetAttribute, through the runtime (no libcuda link).
  using GetAttr = int (*)(void*, int, unsigned long long);
  static GetAttr get = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &fn, 4000, cudaEnableDefault, &found) != cudaSuccess)
#else
    if (cudaGetDriverEntryPoint("cuPointerGetAttribute", &fn, cudaEnableDefault, &found) != cudaSuccess)
#endif
      return GetAttr{nullptr};
    return found == cudaDriverEntryPointSuccess ? reinterpret_cast<GetAttr>(fn) : GetAttr{nullptr};
  }();
  constexpr int kLegacyIpcCapable = 10;  // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: cuMemAlloc memory
  int legacy = 0;
  return get != nullptr && get(&legacy, kLegacyIpcCapable, reinterpret_cast<unsigned long long>(p)) == 0 && legacy;
}

std::string find_group_slot(const char* op, int ordinal, xla::ffi::Span<const int64_t> groups, int64_t tp,
                            xla::ffi::Span<const int64_t> slots, GroupInfo* out, int* ctrl_slot) {
  std::string err = find_group(op, ordinal, groups, tp, out);
  if (!err.empty()) return err;
  // One control block per group (kernels/tp/ag_layout.h): slots[row] of our group.
  if (slots.size() * (size_t)tp != groups.size())
    return std::string(op) + ": " + std::to_string(slots.size()) + " control slots for " +
           std::to_string(groups.size() / tp) + " groups";
  const int64_t slot = slots[out->row];
  if (slot < 0 || slot >= kCtrlSlots)
    return std::string(op) + ": control slot " + std::to_string(slot) + " of group row " + std::to_string(out->row) +
           " is outside 0.." + std::to_string(kCtrlSlots - 1);
  *ctrl_slot = (int)slot;
  return "";
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

std::string PersistentKernel::prepare(int ordinal) {
  if (ordinal < 0 || ordinal >= kMaxOrdinals)
    return std::string(name_) + ": device ordinal " + std::to_string(ordinal) + " is outside 0.." +
           std::to_string(kMaxOrdinals - 1);
  if (ready_[ordinal]) return "";
  int pad = 0;
  const std::string err = prepare_persistent(fn_, threads_, static_smem_, ordinal, &pad);
  if (!err.empty()) return std::string(name_) + ": " + err;
  pad_[ordinal] = pad;
  ready_[ordinal] = true;  // after the padding: a reader that sees ready reads it
  return "";
}

int PersistentKernel::padding(int ordinal) const {
  return ordinal >= 0 && ordinal < kMaxOrdinals && ready_[ordinal] ? pad_[ordinal].load() : -1;
}

std::string prepare_all(PersistentKernels* k, int ordinal) {
  if (ordinal < 0 || ordinal >= kMaxOrdinals)
    return "device ordinal " + std::to_string(ordinal) + " is outside 0.." + std::to_string(kMaxOrdinals - 1);
  for (int t = 0; t < 3; ++t) {
    std::string err = prepare_persistent(k->fn[t], portable::kThreads, k->static_smem, ordinal, &k->dyn_smem[t][ordinal]);
    if (!err.empty()) return err;
  }
  return "";
}

int dtype_index(xla::ffi::DataType t) {
  switch (t) {
    case xla::ffi::DataType::F32: return 0;
    case xla::ffi::DataType::F16: return 1;
    case xla::ffi::DataType::BF16: return 2;
    default: return -1;
  }
}

bool poison_output() {
  static const bool on = [] {
    const char* s = std::getenv("KOSMOS_POISON_OUTPUT");
    return s && *s && std::string(s) != "0";
  }();
  return on;
}

xla::ffi::Error launch_prologue(const char* op, CUstream_st* stream, void* y, size_t y_bytes) {
  using xla::ffi::Error;
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return Error::Internal(std::string(op) + ": pending CUDA error " + cudaGetErrorString(e));
  if (poison_output() && (e = cudaMemsetAsync(y, 0xFF, y_bytes, stream)) != cudaSuccess)
    return Error::Internal(std::string(op) + ": poisoning the output failed: " + cudaGetErrorString(e));
  return Error::Success();
}

xla::ffi::Error launch_result(const char* op, int launch_err, int grid, int ordinal) {
  cudaError_t e = static_cast<cudaError_t>(launch_err);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess)
    return xla::ffi::Error::Internal(std::string(op) + ": launch of " + std::to_string(grid) + " CTAs on ordinal " +
                                     std::to_string(ordinal) + " failed: " + cudaGetErrorString(e));
  return xla::ffi::Error::Success();
}

xla::ffi::Error launch_persistent(const char* op, const PersistentKernels& k, int dtype, void* params,
                                  CUstream_st* stream, int ordinal, int grid, void* y, size_t y_bytes) {
  if (auto err = launch_prologue(op, stream, y, y_bytes); err.failure()) return err;
  void* args[] = {params};
  return launch_result(op, cudaLaunchKernel(k.fn[dtype], dim3(grid), dim3(portable::kThreads), args,
                                            (size_t)k.dyn_smem[dtype][ordinal], stream),
                       grid, ordinal);
}

bool hopper_builders_apply(int dtype, bool ready, int64_t K, int64_t N, const void* x, const void* w,
                           const void* y) {
  auto aligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  return dtype == 2 && ready && !force_portable_builders() && K % 8 == 0 && N % 8 == 0 && aligned(x) &&
         aligned(w) && aligned(y);
}

bool force_portable_builders() {
  static const bool on = [] {
    const char* s = std::getenv("KOSMOS_FUSED_BUILDERS");
    return s && std::string(s) == "portable";
  }();
  return on;
}

std::vector<std::pair<std::string, long long>> engine_counts(const std::atomic<long long>* runs) {
  return {{"sm90", runs[0].load()}, {"portable", runs[1].load()}};
}

uint64_t timeout_ns() {
  static const uint64_t ns = [] {
    const char* s = std::getenv("KOSMOS_TIMEOUT_MS");
    const long long ms = s && *s ? std::atoll(s) : 10000;
    return (uint64_t)(ms > 0 ? ms : 10000) * 1000000ull;
  }();
  return ns;
}

}  // namespace kosmos
