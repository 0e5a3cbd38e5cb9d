// Per-device facts and the current-device guard the CUDA handlers share:
// both sit on every launch's path, so the facts are read once per device.
#pragma once
#include <cuda_runtime.h>

#include <atomic>

namespace kosmos {

constexpr int kMaxDevices = 64;

// SM count of `ordinal` and whether sm_90a code runs on it (exactly cc 9.0),
// cached per device as (sms << 1 | is_sm90); 0 = not read yet.
inline cudaError_t device_facts(int ordinal, int* sms, bool* sm90) {
  static std::atomic<int> cache[kMaxDevices];
  if (ordinal < 0 || ordinal >= kMaxDevices) return cudaErrorInvalidDevice;
  int v = cache[ordinal].load(std::memory_order_acquire);
  if (v == 0) {
    int n = 0, major = 0, minor = 0;
    cudaError_t e = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, ordinal);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal);
    if (e != cudaSuccess) return e;
    v = n << 1 | (major == 9 && minor == 0);
    cache[ordinal].store(v, std::memory_order_release);
  }
  *sms = v >> 1;
  *sm90 = v & 1;
  return cudaSuccess;
}

// Makes `ordinal` current for the launch (function attributes are per device)
// and restores the caller's device afterwards.
struct DeviceGuard {
  int prev = -1;
  cudaError_t err = cudaSuccess;
  explicit DeviceGuard(int ordinal) {
    err = cudaGetDevice(&prev);
    if (err == cudaSuccess && prev != ordinal) err = cudaSetDevice(ordinal);
  }
  ~DeviceGuard() {
    if (prev >= 0) cudaSetDevice(prev);
  }
};

}  // namespace kosmos
