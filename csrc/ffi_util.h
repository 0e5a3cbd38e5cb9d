// Small helpers of the MoE FFI handlers (moe_fwd_cuda.cu, grouped_cuda.cu):
// errors that name the op and the values, shape checks, the launch grid.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "device.h"
#include "xla/ffi/api/ffi.h"

namespace kosmos::ffi_util {

namespace ffi = xla::ffi;

inline ffi::Error Fail(const char* op, const std::string& why) {
  return ffi::Error::InvalidArgument(std::string(op) + ": " + why);
}

inline ffi::Error CudaFail(const char* op, const char* what, int ordinal, cudaError_t e) {
  return ffi::Error::Internal(std::string(op) + ": " + what + " on ordinal " + std::to_string(ordinal) + ": " +
                              cudaGetErrorString(e));
}

inline std::string dims(ffi::AnyBuffer::Dimensions d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

inline bool shaped(ffi::AnyBuffer::Dimensions d, std::initializer_list<int64_t> want) {
  if (d.size() != want.size()) return false;
  size_t i = 0;
  for (int64_t w : want)
    if (d[i++] != w) return false;
  return true;
}

// The grid (one CTA per SM, or cu_cap of them) and whether the device runs sm_90a code.
inline std::string grid_of(int ordinal, int64_t cu_cap, int* grid, bool* sm90) {
  int sms = 0;
  if (cudaError_t e = device_facts(ordinal, &sms, sm90); e != cudaSuccess)
    return std::string("device query on ordinal ") + std::to_string(ordinal) + ": " + cudaGetErrorString(e);
  *grid = (int)(cu_cap > 0 && cu_cap < sms ? cu_cap : sms);
  return "";
}

// The MoE megakernels' movers: the gather of t*k rows runs ahead of the first
// GEMM with about one CTA in 8 (an SM copies ~50 GB/s: benchmarks/RESULTS.md,
// Transport) times `scale`, the rows the launch's first GEMM eats per FLOP
// against the forward's GEMM1: 1 there, 2 in the backward, whose dgrad2 (N = I)
// has half GEMM1's columns (N = 2I), so its builders wait on rows gathered at
// the forward's pace (Qwen3-30B-A3B: 16 movers 3.21 ms, 32 movers 2.89 ms);
// a fixed crew keeps a builder. movers < 0: this rule.
inline int moe_movers(int64_t movers, int grid, bool switching, int scale) {
  const int most = 16 * scale;
  int mv = movers < 0 ? grid * scale / 8 : (int)(movers > grid ? grid : movers);
  mv = mv < 1 ? 1 : mv > most && movers < 0 ? most : mv;
  if (!switching && mv > grid - 1) mv = grid - 1;
  return mv;
}

// Both MoE launches' fold: a warp holds a token's k routed rows and, with a shared
// expert, its row too. "" or why not.
inline std::string moe_shared_top_k(bool shared, int64_t k) {
  if (!shared || k + 1 <= 32) return "";
  return "top_k=" + std::to_string(k) + " must be at most 31 with a shared expert (the fold's warp holds a token's "
         "k rows and the shared one)";
}

// A fused MoE launch's builders on `ordinal` (the current device): the portable
// kernel prepared, or the Hopper one prepared and checked ready. "" or why not.
inline std::string prepare_builders(bool sm90, int ordinal, std::string (*portable)(int), std::string (*hopper)(int),
                                    bool (*hopper_ready)(int)) {
  if (!sm90) return portable(ordinal);
  std::string why = hopper(ordinal);
  if (why.empty() && !hopper_ready(ordinal)) why = "the Hopper kernel could not be prepared on this device";
  return why;
}

}  // namespace kosmos::ffi_util
