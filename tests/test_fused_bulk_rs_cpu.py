"""The fused bulk RS || NT's Python side on CPU (kosmos_jax/ops/_fused_bulk_rs.py):
the kernel's 2-D operands (dx_partial rank-major, x_gathered and dy flattened) and
the outputs folded back, checked by standing a pure-JAX twin of the kernel's 2-D
contract (csrc/bulk_rs_nt_cuda.cu) in for the primitive; the custom call it
lowers to for CUDA; and derivatives through the dispatcher. The kernel itself
runs on GPU only (tests/gpu, the loopback runner). The kernel-less setup is
kosmos_jax.testing.fused_on_cpu; the ops are called through their public names."""
import jax
import jax.numpy as jnp
import pytest

from kosmos_jax import AgConfig, ops, reference
from kosmos_jax.testing import fused_on_cpu, fused_ops
from helpers import P, assert_close, fresh, mesh, put, shard_map


class _KernelTwin:
  """bulk_rs_nt_p's 2-D contract in JAX: dx [rows, k] = chunk `rank` of the rank-order
  sum of dxp [tp*rows, k], rounded once; dw [k, n] = xg [M, k]^T @ dy [M, n]."""

  def bind(self, dxp, xg, dy, *, axis_name, tp, cu_cap, movers, switching):
    assert dxp.ndim == xg.ndim == dy.ndim == 2 and dxp.shape[0] % tp == 0 and xg.shape[0] == dy.shape[0]
    dx = jax.lax.psum_scatter(dxp.astype(jnp.float32), axis_name, scatter_dimension=0, tiled=True)
    dw = jax.lax.dot_general(xg, dy, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return dx.astype(dxp.dtype), dw.astype(xg.dtype)


@pytest.fixture
def no_gpu_needed():
  with fused_on_cpu():
    yield


@pytest.fixture
def kernel_twin():
  with fused_on_cpu({"bulk_rs_nt": _KernelTwin()}):
    yield


def _inputs(tp, lead, m, k, n, dtype):
  specs = (P(*[None] * len(lead), None, "tp"),) * 2 + (P(*[None] * len(lead), None, "tp"),)
  return (fresh((*lead, m, k * tp), dtype), fresh((*lead, m, k * tp), dtype), fresh((*lead, m, n * tp), dtype)), specs


def test_bulk_rs_nt_is_registered():
  assert "bulk_rs_nt" in fused_ops()


@pytest.mark.parametrize("tp,lead", [(2, ()), (2, (3,)), (4, (2, 2))])
def test_operands_and_outputs_fold_like_the_twin(kernel_twin, tp, lead):
  (dxp, xg, dy), specs = _inputs(tp, lead, 8 * tp, 16, 24, jnp.float32)
  m = mesh(tp)
  out = (specs[0], P("tp", None))  # dx sharded like its inputs' rows, dw per rank
  args = [put(a, m, s) for a, s in zip((dxp, xg, dy), specs)]
  got = shard_map(lambda *a: ops.bulk_rs_nt(*a, axis_name="tp", impl="fused", cu_cap=3), m, specs, out)(*args)
  want = shard_map(lambda *a: reference.bulk_rs_nt(*a, axis_name="tp"), m, specs, out)(*args)
  for g, w, name in zip(got, want, ("dx", "dw")):
    assert g.shape == w.shape, name
    assert_close(g, w, what=f"bulk_rs_nt {name} tp={tp} lead={lead}")


def test_grad_is_the_twins(kernel_twin):
  tp = 2
  (dxp, xg, dy), specs = _inputs(tp, (2,), 8, 16, 24, jnp.float32)
  m = mesh(tp)
  out = (specs[0], P("tp", None))
  args = [put(a, m, s) for a, s in zip((dxp, xg, dy), specs)]
  cots = [fresh(s.shape) for s in jax.eval_shape(
      shard_map(lambda *a: reference.bulk_rs_nt(*a, axis_name="tp"), m, specs, out), *args)]

  def grads(impl):
    f = shard_map(lambda *a: ops.bulk_rs_nt(*a, axis_name="tp", impl=impl), m, specs, out)
    return jax.grad(lambda *a: sum(jnp.vdot(y, c) for y, c in zip(f(*a), cots)), argnums=(0, 1, 2))(*args)

  for g, w, name in zip(grads("fused"), grads("reference"), ("dx_partial", "x_gathered", "dy")):
    assert_close(g, w, what=f"bulk_rs_nt grad {name}")


def test_lowers_to_one_custom_call_with_two_results(no_gpu_needed):
  tp, k, n = 2, 16, 24
  (dxp, xg, dy), specs = _inputs(tp, (3,), 8 * tp, k, n, jnp.bfloat16)
  cfg = AgConfig(movers=5, switching=False)
  f = shard_map(lambda *a: ops.bulk_rs_nt(*a, axis_name="tp", impl="fused", config=cfg), mesh(tp), specs,
                (specs[0], P("tp", None)))
  text = f.trace(dxp, xg, dy).lower(lowering_platforms=("cuda",)).as_text()
  calls = [line for line in text.splitlines() if "custom_call @kosmos_bulk_rs_nt" in line]
  assert len(calls) == 1, text[-3000:]
  call = calls[0]
  rows = 3 * 8 * tp // tp  # batch * m / tp rows a chunk
  assert f"tensor<{tp * rows}x{k}xbf16>, tensor<{tp * rows}x{k}xbf16>, tensor<{tp * rows}x{n}xbf16>" in call
  assert f"-> (tensor<{rows}x{k}xbf16>, tensor<{k}x{n}xbf16>)" in call
  assert "movers = 5 : i64" in call and "switching = 0 : i64" in call and "tp = 2 : i64" in call
