// CUDA handler of kosmos_copy: reads XLA's stream and launches the device copy.
#include <string>

#include "handlers.h"
#include "util/copy.cuh"

namespace ffi = xla::ffi;

static ffi::Error CopyCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  if (x.size_bytes() != y->size_bytes()) {
    return ffi::Error::InvalidArgument("kosmos_copy: input has " + std::to_string(x.size_bytes()) +
                                       " bytes, output " + std::to_string(y->size_bytes()));
  }
  cudaError_t err = kosmos::launch_copy(y->untyped_data(), x.untyped_data(), x.size_bytes(), stream);
  if (err != cudaSuccess) {
    return ffi::Error::Internal(std::string("kosmos_copy: launch failed: ") + cudaGetErrorString(err));
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_copy_cuda, CopyCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's compute stream
                                  .Arg<ffi::AnyBuffer>()                     // x
                                  .Ret<ffi::AnyBuffer>());                   // y
