// Process-wide runtime state: one symmetric heap per local device, the peers'
// heap addresses (peer access or CUDA IPC), and the global-id <-> ordinal table.
// XLA's FFI state is per process, so this is one object with a per-device table.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace kosmos {

struct DeviceEntry {
  int ordinal = -1;
  int64_t global_id = -1;
  char* heap = nullptr;
  size_t heap_bytes = 0;
  int sm_count = 0;
};

class Runtime {
 public:
  static Runtime& get();

  // Allocates (once) and zeroes a heap of `bytes` on each ordinal, enables peer
  // access between every pair that supports it. Returns "" or an error.
  std::string init_local(const std::vector<int>& ordinals, const std::vector<int64_t>& global_ids,
                         size_t bytes);
  // 64-byte CUDA IPC handle of a local heap, for the other processes.
  std::string ipc_handle(int ordinal, std::string* handle);
  // Maps a peer process's heap (device `global_id`) into this process.
  std::string ipc_open(int64_t global_id, const std::string& handle, int local_ordinal);

  // Lookups for the FFI handlers (thread-safe).
  bool local(int ordinal, DeviceEntry* out);
  // Heap of device `global_id` as seen from local `ordinal`, or nullptr + why.
  char* heap_for(int ordinal, int64_t global_id, std::string* why);
  size_t heap_bytes();
  // Whether device `global_id` is one of this process's (its pointers valid here).
  bool is_local(int64_t global_id);
  std::vector<int64_t> mapped_ids();

 private:
  std::mutex mu_;
  size_t bytes_ = 0;
  std::map<int, DeviceEntry> local_;         // ordinal -> entry
  std::map<int64_t, int> ordinal_of_;        // global id -> local ordinal
  std::map<int64_t, char*> remote_;          // global id -> IPC-mapped heap
  std::set<std::pair<int, int>> peer_ok_;    // (from, to) ordinals with peer access
};

}  // namespace kosmos
