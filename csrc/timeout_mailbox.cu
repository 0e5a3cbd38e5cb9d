// Mapped host memory for in-kernel timeout reports and the thread that prints
// them (csrc/timeout_mailbox.h). A kernel that traps leaves its CUDA context
// unusable, so the report cannot be copied back afterwards: it is written to
// host memory by the device and read there.
#include "timeout_mailbox.h"

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

namespace kosmos {
namespace {

constexpr int kOrdinals = 64;
constexpr int kUnits = static_cast<int>(TimeoutUnit::kCount);
constexpr int kRecords = kOrdinals * kUnits * kTimeoutSlots;

// Never destroyed: the printer thread may still poll while statics are torn down.
std::mutex& mu() {
  static auto* m = new std::mutex;
  return *m;
}
TimeoutRecord* g_box = nullptr;  // kRecords records, mapped into every device's address space
bool g_failed = false;

// Runs the last print at normal process exit (a report written just before a
// failing call ends the program is not lost between two polls).
struct FinalPrint {
  ~FinalPrint() { print_timeout_reports(); }
} g_final_print;

void print_one(volatile TimeoutRecord* r, int ordinal) {
  char kernel[kTimeoutNameLen], flag[kTimeoutNameLen];
  for (int i = 0; i < kTimeoutNameLen; ++i) kernel[i] = r->kernel[i], flag[i] = r->flag[i];
  kernel[kTimeoutNameLen - 1] = flag[kTimeoutNameLen - 1] = 0;
  std::fprintf(stderr,
               "kosmos timeout: kernel=%s rank=%d cta=%d flag=%s[%d] expected>=%llu seen=%llu after %llu ms "
               "(CUDA device %d)\n",
               kernel, (int)r->rank, (int)r->cta, flag, (int)r->index, (unsigned long long)r->expected,
               (unsigned long long)r->seen, (unsigned long long)r->after_ms, ordinal);
  std::fflush(stderr);
}

bool create_box() {  // under mu()
  void* p = nullptr;
  if (cudaHostAlloc(&p, sizeof(TimeoutRecord) * kRecords, cudaHostAllocMapped | cudaHostAllocPortable) !=
      cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for the caller
    return false;
  }
  std::memset(p, 0, sizeof(TimeoutRecord) * kRecords);
  g_box = static_cast<TimeoutRecord*>(p);
  std::thread([] {
    for (;;) {
      print_timeout_reports();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }).detach();
  return true;
}

}  // namespace

TimeoutRecord* timeout_records(int ordinal, TimeoutUnit unit) {
  if (ordinal < 0 || ordinal >= kOrdinals) return nullptr;
  std::lock_guard<std::mutex> lock(mu());
  if (g_box == nullptr && !g_failed) g_failed = !create_box();
  if (g_box == nullptr) return nullptr;
  // Unified addressing: the host pointer of portable mapped memory is its device
  // pointer on every device.
  return g_box + (ordinal * kUnits + static_cast<int>(unit)) * kTimeoutSlots;
}

void print_timeout_reports() {
  std::lock_guard<std::mutex> lock(mu());
  if (g_box == nullptr) return;
  for (int i = 0; i < kRecords; ++i) {
    volatile TimeoutRecord* r = g_box + i;
    if (r->ready != 1) continue;
    std::atomic_thread_fence(std::memory_order_acquire);  // the fields were written before `ready`
    print_one(r, i / (kUnits * kTimeoutSlots));
    r->ready = 2;
  }
}

}  // namespace kosmos
