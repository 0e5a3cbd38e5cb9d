// Symmetric heap: allocated once per device with cudaMalloc, zeroed, never freed
// while the process runs (no cudaFree during collectives). Single process: peers
// are reached through peer access and raw UVA pointers. One process per GPU:
// heaps are exported as CUDA IPC handles and opened by every other process.
#include <cuda_runtime.h>

#include <cstring>

#include "runtime.h"

namespace kosmos {

static std::string cuda_err(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

Runtime& Runtime::get() {
  static Runtime* rt = new Runtime();  // never destroyed: kernels may still reference heaps at exit
  return *rt;
}

std::string Runtime::init_local(const std::vector<int>& ordinals, const std::vector<int64_t>& global_ids,
                                size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ordinals.size() != global_ids.size()) return "init_local: ordinals and global ids differ in length";
  if (bytes_ != 0 && bytes != bytes_)
    return "symmetric heap already allocated with " + std::to_string(bytes_ >> 20) + " MiB; cannot resize to " +
           std::to_string(bytes >> 20) + " MiB in the same process";
  int prev = 0;
  cudaGetDevice(&prev);
  for (size_t i = 0; i < ordinals.size(); ++i) {
    const int d = ordinals[i];
    if (local_.count(d)) continue;
    cudaError_t e = cudaSetDevice(d);
    if (e != cudaSuccess) return cuda_err(("cudaSetDevice(" + std::to_string(d) + ")").c_str(), e);
    DeviceEntry ent;
    ent.ordinal = d;
    ent.global_id = global_ids[i];
    ent.heap_bytes = bytes;
    if ((e = cudaDeviceGetAttribute(&ent.sm_count, cudaDevAttrMultiProcessorCount, d)) != cudaSuccess)
      return cuda_err("cudaDeviceGetAttribute(SM count)", e);
    void* p = nullptr;
    if ((e = cudaMalloc(&p, bytes)) != cudaSuccess)
      return cuda_err(("cudaMalloc of a " + std::to_string(bytes >> 20) + " MiB heap on device ordinal " +
                       std::to_string(d)).c_str(), e);
    if ((e = cudaMemset(p, 0, bytes)) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess)
      return cuda_err("zeroing the heap", e);
    ent.heap = static_cast<char*>(p);
    local_[d] = ent;
    ordinal_of_[ent.global_id] = d;
  }
  bytes_ = bytes;
  for (auto& [a, ea] : local_)
    for (auto& [b, eb] : local_) {
      if (a == b || peer_ok_.count({a, b})) continue;
      int can = 0;
      cudaDeviceCanAccessPeer(&can, a, b);
      if (!can) continue;
      cudaSetDevice(a);
      cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) { cudaGetLastError(); e = cudaSuccess; }
      if (e != cudaSuccess) return cuda_err("cudaDeviceEnablePeerAccess", e);
      peer_ok_.insert({a, b});
    }
  cudaSetDevice(prev);
  return "";
}

std::string Runtime::ipc_handle(int ordinal, std::string* handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = local_.find(ordinal);
  if (it == local_.end()) return "no heap on device ordinal " + std::to_string(ordinal);
  cudaIpcMemHandle_t h;
  cudaError_t e = cudaIpcGetMemHandle(&h, it->second.heap);
  if (e != cudaSuccess) return cuda_err("cudaIpcGetMemHandle", e);
  handle->assign(reinterpret_cast<const char*>(&h), sizeof(h));
  return "";
}

std::string Runtime::ipc_open(int64_t global_id, const std::string& handle, int local_ordinal) {
  std::lock_guard<std::mutex> lock(mu_);
  if (remote_.count(global_id) || ordinal_of_.count(global_id)) return "";
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h)) return "IPC handle of device " + std::to_string(global_id) + " has wrong size";
  std::memcpy(&h, handle.data(), sizeof(h));
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(local_ordinal);
  void* p = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  cudaSetDevice(prev);
  if (e != cudaSuccess)
    return cuda_err(("cudaIpcOpenMemHandle for the heap of device " + std::to_string(global_id)).c_str(), e);
  remote_[global_id] = static_cast<char*>(p);
  return "";
}

bool Runtime::local(int ordinal, DeviceEntry* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = local_.find(ordinal);
  if (it == local_.end()) return false;
  *out = it->second;
  return true;
}

char* Runtime::heap_for(int ordinal, int64_t global_id, std::string* why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto o = ordinal_of_.find(global_id);
  if (o != ordinal_of_.end()) {
    if (o->second == ordinal || peer_ok_.count({ordinal, o->second})) return local_[o->second].heap;
    *why = "device " + std::to_string(global_id) + " (ordinal " + std::to_string(o->second) +
           ") has no peer access from ordinal " + std::to_string(ordinal);
    return nullptr;
  }
  auto r = remote_.find(global_id);
  if (r != remote_.end()) return r->second;
  *why = "device " + std::to_string(global_id) + " has no symmetric heap mapped in this process";
  return nullptr;
}

bool Runtime::is_local(int64_t global_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return ordinal_of_.count(global_id) > 0;
}

size_t Runtime::heap_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

std::vector<int64_t> Runtime::mapped_ids() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> ids;
  for (auto& [g, o] : ordinal_of_) ids.push_back(g);
  for (auto& [g, p] : remote_) ids.push_back(g);
  return ids;
}

}  // namespace kosmos
