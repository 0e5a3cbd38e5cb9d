"""The compiled extension: build -> load -> register, without a GPU.

CI builds the module with its CUDA kernels (nvcc is there). Registering a CUDA
FFI target needs no GPU, so a CPU machine checks that the module exports, and JAX
accepts, exactly the `kosmos_<op>` target of every op with a fused kernel.
tests/gpu/ runs the calls."""
import os

import jax.numpy as jnp
import pytest

from kosmos_jax import _ext, ops
from kosmos_jax.testing import fused_ops
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
  assert _ext._module()[0].cuda_built(), "CI's build has nvcc, so it must compile the CUDA kernels"


@pytest.mark.skipif(not _ext.loaded(), reason=f"extension not loaded: {_ext.loaded().reason}")
def test_every_fused_op_has_its_registered_target():
  mod, _ = _ext._module()
  if not mod.cuda_built():
    pytest.skip("extension built without CUDA kernels: it exports no FFI targets")
  want = {f"kosmos_{op}" for op in fused_ops()}
  got = set(mod.registrations())
  # Benchmark facilities, not ops (kosmos_jax.testing): the MoE floor's grouped GEMMs.
  facilities = {"kosmos_grouped_gemm", "kosmos_grouped_dgrad", "kosmos_grouped_swiglu_bwd", "kosmos_grouped_wgrad"}
  # Kernels an op's fused path runs beside its own: the fused MoE forward's routing ids.
  helpers = {"kosmos_moe_select"}
  assert want | helpers <= got <= want | helpers | facilities, "the module's targets and the ops' kernels differ"
  for name in sorted(got):
    assert _ext.has_target(name, "cuda"), f"{name}: exported but not registered: {_ext._registered()[1]}"


def test_missing_extension_is_explained(monkeypatch):
  """Without the extension nothing is registered, every status says why, and a
  call that insists on the fused path raises with that reason."""
  monkeypatch.setattr(_ext, "_registered", lambda: (frozenset(), "test: disabled"))
  assert not _ext.loaded() and _ext.loaded().reason == "test: disabled"
  assert not _ext.available() and _ext.available().reason == "test: disabled"
  assert not _ext.has_target("kosmos_matmul", "cuda")
  with pytest.raises(NotImplementedError, match="test: disabled"):
    ops.matmul(fresh((8, 16), jnp.bfloat16), fresh((16, 8), jnp.bfloat16), layout="TN", impl="fused")
