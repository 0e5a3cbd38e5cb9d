"""The compiled extension: build -> load -> register -> ffi_call, on the CPU handler.

CI builds the module (with its CUDA kernels, since nvcc is there); the CPU handler
of kosmos_copy proves the chain without a GPU. tests/gpu/ runs the CUDA one."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kosmos_jax import _ext, ops
from helpers import fresh

REQUIRE = os.environ.get("KOSMOS_REQUIRE_EXT", "") not in ("", "0")


def test_availability_is_explained():
  for state in (_ext.loaded(), _ext.available()):
    assert isinstance(state.ok, bool) and state.reason
    assert bool(state) == state.ok


def test_extension_loaded_when_required():
  """CI sets KOSMOS_REQUIRE_EXT=1: a build that silently failed must fail here."""
  if not REQUIRE:
    pytest.skip("KOSMOS_REQUIRE_EXT not set")
  assert _ext.loaded(), _ext.loaded().reason
  assert _ext.has_target("kosmos_copy", "cpu")


@pytest.mark.skipif(not _ext.loaded(), reason=f"extension not loaded: {_ext.loaded().reason}")
@pytest.mark.parametrize("shape,dtype", [((37,), jnp.float32), ((5, 33), jnp.bfloat16),
                                         ((3, 4, 5), jnp.float16), ((0,), jnp.float32)])
def test_copy_through_ffi(shape, dtype):
  x = fresh(shape, dtype)
  y = jax.jit(ops.copy)(x)
  assert y.dtype == x.dtype and y.shape == x.shape
  np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


def test_copy_without_extension_raises(monkeypatch):
  monkeypatch.setattr(_ext, "loaded", lambda: _ext.Availability(False, "test: disabled"))
  with pytest.raises(NotImplementedError, match="test: disabled"):
    ops.copy(fresh((4,)))
