// Host queries of the CUDA runtime that Python needs to decide if kernels can run.
#pragma once
#include <string>

namespace kosmos {
// Number of visible CUDA devices, or -1 with the runtime's error in `error`.
int cuda_device_count(std::string* error);
}  // namespace kosmos
