// Shared launch plumbing of the persistent kernels: the per-launch group and
// control-slot lookup, the once-per-device preparation (module load,
// shared-memory padding, occupancy check), the launch itself (poison, errors),
// and the environment knobs every fused op reads.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tp/ag_layout.h"
#include "xla/ffi/api/ffi.h"

struct CUstream_st;  // cudaStream_t, without pulling CUDA headers into module.cc

namespace kosmos {

struct GroupInfo {
  int rank = -1;
  int row = -1;  // which group (row of `groups`) holds this device
  int sm_count = 0;
  size_t heap_bytes = 0;
  char* heaps[kMaxRanks] = {};
  int trace_list = 0;  // role timelines: this rank's first per-CTA list on the device (trace_buf)
  bool all_local = false;  // every member's device is in this process (peer access, raw pointers)
};

// Whether the group's peers may read `p`, an operand of this rank, directly
// (AgParams::direct): every member is in this process, and p is a cuMemAlloc
// allocation, which peer access maps to every peer (VMM and memory-pool
// allocations are mapped only where their owner grants it, and another
// process's pointers mean nothing here).
bool peers_read_directly(const GroupInfo& g, const void* p);

// The persistent grid: one CTA per SM, or cu_cap CTAs when 0 < cu_cap < SMs.
inline int fused_grid(int64_t cu_cap, const GroupInfo& g) {
  return (int)(cu_cap > 0 && cu_cap < g.sm_count ? cu_cap : g.sm_count);
}

// Finds the group (a row of `groups`, tp global ids each) holding this device and
// every member's heap. Returns "" or an error naming the devices.
std::string find_group(const char* op, int ordinal, xla::ffi::Span<const int64_t> groups, int64_t tp,
                       GroupInfo* out);

// find_group, then this group's control slot: slots[row] of the group's row, one
// per group, checked against kCtrlSlots. Returns "" or an error naming the values.
std::string find_group_slot(const char* op, int ordinal, xla::ffi::Span<const int64_t> groups, int64_t tp,
                            xla::ffi::Span<const int64_t> slots, GroupInfo* out, int* ctrl_slot);

// Loads `kernel`'s module on `ordinal`, pads its dynamic shared memory so that
// only one CTA fits per SM, and checks that exactly one does.
std::string prepare_persistent(const void* kernel, int threads, size_t static_smem, int ordinal, int* dyn_smem);

// One persistent kernel per element type (f32, f16, bf16, in DataType order of
// dtype_index) and the dynamic shared memory each got on each device.
constexpr int kMaxOrdinals = 64;
struct PersistentKernels {
  const void* fn[3];
  size_t static_smem;
  int dyn_smem[3][kMaxOrdinals];
};
std::string prepare_all(PersistentKernels* k, int ordinal);

// One persistent kernel of one type (the MoE megakernels' portable builders),
// prepared once per device: a static instance per launcher.
class PersistentKernel {
 public:
  PersistentKernel(const void* fn, int threads, size_t static_smem, const char* name)
      : fn_(fn), threads_(threads), static_smem_(static_smem), name_(name) {}
  // "" once prepared on `ordinal` (prepare_persistent, the first call there), else why not, named.
  std::string prepare(int ordinal);
  // The dynamic shared memory (padding) it launches with on a prepared `ordinal`, else -1.
  int padding(int ordinal) const;

 private:
  const void* fn_;
  int threads_;
  size_t static_smem_;
  const char* name_;
  std::atomic<int> pad_[kMaxOrdinals] = {};
  std::atomic<bool> ready_[kMaxOrdinals] = {};
};

// 0 for f32, 1 for f16, 2 for bf16, -1 otherwise.
int dtype_index(xla::ffi::DataType t);

// Launches k.fn[dtype] with grid x kThreads threads and `params` as its one
// argument on `stream`; with KOSMOS_POISON_OUTPUT set, fills y with NaN bytes
// first, so an element the kernel forgets to write shows up as NaN.
xla::ffi::Error launch_persistent(const char* op, const PersistentKernels& k, int dtype, void* params,
                                  CUstream_st* stream, int ordinal, int grid, void* y, size_t y_bytes);

// KOSMOS_POISON_OUTPUT=1 (tests): outputs are filled with NaN bytes before a
// launch, so an element a kernel forgets to write shows up as NaN.
bool poison_output();

// The two halves every fused launch shares. launch_prologue: no pending CUDA
// error, then (KOSMOS_POISON_OUTPUT) y filled with NaN bytes. launch_result: the
// error a launch returned (a cudaError_t as int) or left pending, as an FFI error
// naming the op, grid and device.
xla::ffi::Error launch_prologue(const char* op, CUstream_st* stream, void* y, size_t y_bytes);
xla::ffi::Error launch_result(const char* op, int launch_err, int grid, int ordinal);

// KOSMOS_FUSED_BUILDERS=portable: fused kernels use their portable builders even
// where the Hopper ones could run (comparisons, debugging).
bool force_portable_builders();

// Whether a fused launch may use its Hopper builders: bf16 (dtype_index 2), the
// op's sm_90 kernel `ready` on this device, not forced portable, and what TMA
// needs (leading dimensions K and N multiples of 8 elements, 16-byte bases).
bool hopper_builders_apply(int dtype, bool ready, int64_t K, int64_t N, const void* x, const void* w,
                           const void* y);

// launch_prologue, then `launch()` (a launch returning cudaError_t), then
// launch_result; counts the launch in *runs only when it was accepted.
template <class Launch>
xla::ffi::Error launch_counted(const char* op, CUstream_st* stream, void* y, size_t y_bytes, int grid, int ordinal,
                               std::atomic<long long>* runs, Launch&& launch) {
  if (auto err = launch_prologue(op, stream, y, y_bytes); err.failure()) return err;
  xla::ffi::Error err = launch_result(op, (int)launch(), grid, ordinal);
  if (err.success()) ++*runs;
  return err;
}

// KOSMOS_TIMEOUT_MS (default 10 s) as nanoseconds: every spin's bound.
uint64_t timeout_ns();

// Per-kernel preparation, run by runtime init for every local device.
std::string ag_tn_prepare(int ordinal);  // ag_tn and ag_nn
std::string bulk_ag_nn_prepare(int ordinal);
std::string tn_rs_prepare(int ordinal);
std::string bulk_rs_nt_prepare(int ordinal);

// Test hooks: fused launches per builder engine since the process started, as
// (engine, count): "sm90" (Hopper builders), "portable". engine_counts reads an
// op's two counters (launch_fused's runs, the MoE handler's) in that form.
std::vector<std::pair<std::string, long long>> engine_counts(const std::atomic<long long>* runs);
std::vector<std::pair<std::string, long long>> ag_tn_engine_runs();
std::vector<std::pair<std::string, long long>> ag_nn_engine_runs();
std::vector<std::pair<std::string, long long>> bulk_ag_nn_engine_runs();
std::vector<std::pair<std::string, long long>> tn_rs_engine_runs();
std::vector<std::pair<std::string, long long>> bulk_rs_nt_engine_runs();
std::vector<std::pair<std::string, long long>> moe_forward_engine_runs();  // kosmos_moe_forward
std::vector<std::pair<std::string, long long>> moe_backward_engine_runs();  // kosmos_moe_backward

}  // namespace kosmos
