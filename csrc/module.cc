// nanobind module _kosmos_ext: exposes the FFI handlers as capsules (registered by
// kosmos_jax/_ext.py) and the build facts Python needs to explain what is available.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/pair.h>

#include <string>

#include "handlers.h"
#ifdef KOSMOS_WITH_CUDA
#include "cuda_info.h"
#endif

namespace nb = nanobind;

template <typename T>
static nb::capsule Encapsulate(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

// {target name: {platform: handler capsule}}
static nb::dict Registrations() {
  nb::dict out;
  nb::dict copy;
  copy["cpu"] = Encapsulate(kosmos_copy_cpu);
#ifdef KOSMOS_WITH_CUDA
  copy["CUDA"] = Encapsulate(kosmos_copy_cuda);
#endif
  out["kosmos_copy"] = copy;
  return out;
}

static bool CudaBuilt() {
#ifdef KOSMOS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// (device count, error): count is -1 when the runtime could not be queried.
static std::pair<int, std::string> CudaDeviceCount() {
#ifdef KOSMOS_WITH_CUDA
  std::string error;
  int n = kosmos::cuda_device_count(&error);
  return {n, error};
#else
  return {-1, "extension built without CUDA (KOSMOS_CUDA=off or nvcc not found)"};
#endif
}

NB_MODULE(_kosmos_ext, m) {
  m.def("registrations", &Registrations);
  m.def("cuda_built", &CudaBuilt);
  m.def("cuda_device_count", &CudaDeviceCount);
}
