#include "trace_buf.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>

namespace kosmos {
namespace {

struct DeviceTrace {
  TraceRecord* records = nullptr;
  uint32_t* count = nullptr;
  uint32_t cap = 0;
  bool on = false;
};

std::mutex g_mu;
std::map<int, DeviceTrace> g_dev;  // ordinal -> buffers

std::string err(const char* what, int ordinal, cudaError_t e) {
  return std::string("kosmos trace: ") + what + " on ordinal " + std::to_string(ordinal) + ": " +
         cudaGetErrorString(e);
}

// Runs f with `ordinal` current, restoring the caller's device.
template <class F>
cudaError_t on_device(int ordinal, F f) {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaError_t e = cudaSetDevice(ordinal);
  if (e == cudaSuccess) e = f();
  cudaSetDevice(prev);
  return e;
}

}  // namespace

bool trace_compiled() {
#ifdef KOSMOS_TRACE
  return true;
#else
  return false;
#endif
}

std::string trace_enable(int ordinal, uint32_t cap_per_cta) {
  if (cap_per_cta == 0) return "kosmos trace: cap_per_cta must be positive";
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceTrace& d = g_dev[ordinal];
  cudaError_t e = on_device(ordinal, [&] {
    cudaError_t r = cudaDeviceSynchronize();  // no launch may be appending meanwhile
    if (r == cudaSuccess && d.cap != cap_per_cta) {
      if (d.records) cudaFree(d.records), cudaFree(d.count), d.records = nullptr, d.count = nullptr;
      r = cudaMalloc(&d.records, sizeof(TraceRecord) * cap_per_cta * kTraceMaxCtas);
      if (r == cudaSuccess) r = cudaMalloc(&d.count, sizeof(uint32_t) * kTraceMaxCtas);
      d.cap = r == cudaSuccess ? cap_per_cta : 0;
    }
    if (r == cudaSuccess) r = cudaMemset(d.count, 0, sizeof(uint32_t) * kTraceMaxCtas);
    return r;
  });
  if (e != cudaSuccess) return err("allocating the record buffers", ordinal, e);
  d.on = true;
  return "";
}

void trace_disable(int ordinal) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_dev.find(ordinal);
  if (it != g_dev.end()) it->second.on = false;
}

std::string trace_read(int ordinal, std::string* records, std::string* counts, uint32_t* cap) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_dev.find(ordinal);
  if (it == g_dev.end() || it->second.records == nullptr)
    return "kosmos trace: recording was never enabled on ordinal " + std::to_string(ordinal);
  const DeviceTrace& d = it->second;
  records->resize(sizeof(TraceRecord) * d.cap * kTraceMaxCtas);
  counts->resize(sizeof(uint32_t) * kTraceMaxCtas);
  cudaError_t e = on_device(ordinal, [&] {
    cudaError_t r = cudaDeviceSynchronize();  // every launch of the captured step has ended
    if (r == cudaSuccess) r = cudaMemcpy(&(*records)[0], d.records, records->size(), cudaMemcpyDeviceToHost);
    if (r == cudaSuccess) r = cudaMemcpy(&(*counts)[0], d.count, counts->size(), cudaMemcpyDeviceToHost);
    return r;
  });
  if (e != cudaSuccess) return err("reading the records", ordinal, e);
  *cap = d.cap;
  return "";
}

TraceBuf trace_buf(int ordinal, int rank, int first_list) {
  if (!trace_compiled()) return TraceBuf{nullptr, nullptr, 0, 0};  // every launch asks: no lock then
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_dev.find(ordinal);
  if (it == g_dev.end() || !it->second.on || first_list < 0 || first_list >= kTraceMaxCtas)
    return TraceBuf{nullptr, nullptr, 0, 0};
  const DeviceTrace& d = it->second;
  return TraceBuf{d.records + (size_t)first_list * d.cap, d.count + first_list, d.cap, (uint8_t)rank};
}

}  // namespace kosmos
