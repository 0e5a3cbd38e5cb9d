"""kosmos_copy on the GPU: the build -> load -> register -> ffi_call chain on CUDA."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kosmos_jax import ops
from helpers import fresh


def _gpus():
  return [d for d in jax.devices() if d.platform == "gpu"]


@pytest.mark.parametrize("shape,dtype", [((1024, 1024), jnp.float32), ((3, 777), jnp.bfloat16),
                                         ((13,), jnp.float16), ((1 << 22,), jnp.bfloat16)])
def test_copy_matches_input_on_every_gpu(shape, dtype):
  for dev in _gpus():
    x = jax.device_put(fresh(shape, dtype), dev)
    y = jax.jit(ops.copy)(x)
    assert y.devices() == {dev}
    np.testing.assert_array_equal(np.asarray(y.astype(jnp.float32)), np.asarray(x.astype(jnp.float32)))


def test_copy_back_to_back_fresh_inputs():
  dev = _gpus()[0]
  f = jax.jit(ops.copy)
  for _ in range(20):
    x = jax.device_put(fresh((4099,), jnp.float32), dev)
    np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(x))
