// Shared launch plumbing of the persistent kernels: the per-launch group lookup
// and the once-per-device preparation (module load, shared-memory padding,
// occupancy check).
#pragma once
#include <cstdint>
#include <string>

#include "tp/ag_layout.h"
#include "xla/ffi/api/ffi.h"

namespace kosmos {

struct GroupInfo {
  int rank = -1;
  int row = -1;  // which group (row of `groups`) holds this device
  int sm_count = 0;
  size_t heap_bytes = 0;
  char* heaps[kMaxRanks] = {};
};

// Finds the group (a row of `groups`, tp global ids each) holding this device and
// every member's heap. Returns "" or an error naming the devices.
std::string find_group(const char* op, int ordinal, xla::ffi::Span<const int64_t> groups, int64_t tp,
                       GroupInfo* out);

// Loads `kernel`'s module on `ordinal`, pads its dynamic shared memory so that
// only one CTA fits per SM, and checks that exactly one does.
std::string prepare_persistent(const void* kernel, int threads, size_t static_smem, int ordinal, int* dyn_smem);

// Per-kernel preparation, run by runtime init for every local device.
std::string ag_tn_prepare(int ordinal);

}  // namespace kosmos
