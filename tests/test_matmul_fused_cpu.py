"""The fused matmul on a machine without a usable GPU: registered with the
dispatcher, but impl='fused' raises NotImplementedError saying why (never a
silent fallback), and auto picks the reference twin."""
import re

import jax.numpy as jnp
import pytest

from kosmos_jax import ops, reference
from kosmos_jax.testing import fused_ops, matmul_flops as flops
from helpers import assert_close, fresh


def _no_gpu():
  ok, why = ops.fused_status("matmul")
  if ok:
    pytest.skip("fused kernels are usable here (GPU host): tests/gpu/test_matmul.py covers them")
  return why


def test_fused_matmul_is_registered():
  assert "matmul" in fused_ops()


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_fused_without_gpu_raises_naming_why(layout):
  why = _no_gpu()
  assert "no fused kernel" not in why  # the kernel exists; what is missing is the GPU or the build
  a = fresh((2, 8, 16))
  b = fresh((2, 8, 24)) if layout == "NT" else fresh((16, 24) if layout == "TN" else (24, 16))
  with pytest.raises(NotImplementedError, match=r"'matmul' was asked to run fused.*" + re.escape(why)):
    ops.matmul(a, b, layout=layout, impl="fused")
  with pytest.raises(NotImplementedError, match="cannot"):
    ops.matmul(a, b, layout=layout, impl="fused", cu_cap=1)
  assert_close(ops.matmul(a, b, layout=layout, impl="auto"), reference.matmul(a, b, layout=layout),
               jnp.float32, what=f"auto {layout}")


def test_flops_of_folded_shapes():
  assert flops((2, 8, 16), (16, 24), "TN") == 2.0 * 16 * 16 * 24
  assert flops((2, 8, 24), (16, 24), "NN") == 2.0 * 16 * 24 * 16
  assert flops((2, 8, 16), (2, 8, 24), "NT") == 2.0 * 16 * 16 * 24
