#include <cuda_runtime.h>

#include "cuda_info.h"

namespace kosmos {
int cuda_device_count(std::string* error) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    *error = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return -1;
  }
  return n;
}
}  // namespace kosmos
