"""`copy(x)`: the FFI chain's smoke test (build -> load -> register -> ffi_call).

Runs the extension's `kosmos_copy` handler on the array's platform (a CPU handler
and a CUDA kernel are both compiled). It has no reference path: if the target is
not registered it raises, so a test of it cannot pass by falling back.
"""
from __future__ import annotations

import jax

from kosmos_jax import _ext


def copy(x):
  """y = x, through the compiled kosmos_copy FFI target."""
  state = _ext.loaded()
  if not state:
    raise NotImplementedError(f"kosmos_copy needs the compiled extension: {state.reason}")
  return jax.ffi.ffi_call("kosmos_copy", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
