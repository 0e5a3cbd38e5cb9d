// The host side of the in-kernel timeout mailbox (kernels/include/kosmos/
// timeout_mailbox.h): one block of mapped, pinned host memory holding
// kTimeoutSlots records per (device, reporting translation unit), and a host
// thread that prints every record a kernel writes to stderr.
#pragma once
#include "kosmos/timeout_mailbox.h"

namespace kosmos {

// Translation units that report through the mailbox.
enum class TimeoutUnit : int {
  kAgTnSm90 = 0,    // csrc/ag_tn_sm90.cu: ag_tn and ag_nn
  kTnRsSm90 = 1,    // csrc/tn_rs_sm90.cu
  kBulkAgSm90 = 2,  // csrc/bulk_ag_nn_sm90.cu
  kBulkRsSm90 = 3,  // csrc/bulk_rs_nt_sm90.cu
  kMoeFwdSm90 = 4,  // csrc/moe_fwd_sm90.cu
  kMoeBwdSm90 = 5,  // csrc/moe_bwd_sm90.cu
  kCount = 6
};

// The records of (ordinal, unit), creating the mailbox and starting its printer
// on first use; nullptr when mapped host memory is unavailable (kernels then
// trap without a report). Thread-safe.
TimeoutRecord* timeout_records(int ordinal, TimeoutUnit unit);

// Prints records written since the last call (the printer thread calls this
// every 20 ms, and once more at process exit). Thread-safe.
void print_timeout_reports();

}  // namespace kosmos
