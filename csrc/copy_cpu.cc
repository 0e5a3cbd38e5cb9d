// CPU handler of kosmos_copy, so CI can prove the FFI chain on a machine with no GPU.
#include <cstring>
#include <string>

#include "handlers.h"

namespace ffi = xla::ffi;

static ffi::Error CopyCpu(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  if (x.size_bytes() != y->size_bytes()) {
    return ffi::Error::InvalidArgument("kosmos_copy: input has " + std::to_string(x.size_bytes()) +
                                       " bytes, output " + std::to_string(y->size_bytes()));
  }
  std::memcpy(y->untyped_data(), x.untyped_data(), x.size_bytes());
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_copy_cpu, CopyCpu,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>()  // x: any shape/dtype
                                  .Ret<ffi::AnyBuffer>());            // y: same bytes as x
