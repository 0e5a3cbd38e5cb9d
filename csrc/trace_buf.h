// Per-device role-timeline buffers (kernels/include/kosmos/trace.h) for kernels
// built with KOSMOS_TRACE=ON: allocated on request, handed to every fused launch
// on that device while enabled, read back by kosmos_jax.trace.capture. Plain C++
// (module.cc includes it without nvcc). A debug facility: enabling, clearing and
// reading synchronise the device.
#pragma once
#include <cstdint>
#include <string>

#include "kosmos/trace.h"

namespace kosmos {

constexpr int kTraceMaxCtas = 1024;  // record lists per device (>= any grid)

// Whether the kernels were compiled with KOSMOS_TRACE (otherwise they never record).
bool trace_compiled();

// Allocates (once) cap_per_cta records for each of kTraceMaxCtas CTAs on `ordinal`,
// zeroes the counts and turns recording on for later launches there.
std::string trace_enable(int ordinal, uint32_t cap_per_cta);
// Turns recording off on `ordinal` (the buffers stay for trace_read).
void trace_disable(int ordinal);
// Copies the record lists and counts of `ordinal` to the host after the device is idle.
std::string trace_read(int ordinal, std::string* records, std::string* counts, uint32_t* cap);

// The buffer a launch on `ordinal` records into, as rank `rank`, its CTA c into
// list first_list + c (records == nullptr: recording off). One rank per device
// starts at list 0; the loopback hook gives each rank on the device its own lists.
TraceBuf trace_buf(int ordinal, int rank, int first_list = 0);

}  // namespace kosmos
