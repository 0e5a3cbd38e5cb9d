"""Derivatives of fused ops. The FFI primitives have no differentiation rules, so the
ops route a fused call through the dispatcher's `run_fused`, which gives it its reference
twin's JVP (and, transposed, its VJP). On CPU a stand-in plays the fused kernel: the
twin's value with its own derivative cut (stop_gradient on every input), so only
run_fused's rule can produce the right derivative; the first test shows the
stand-in alone differentiates to zero. The real kernels are checked on GPU
(tests/gpu/test_ag_tn_sm90.py::test_grad_through_fused_op)."""
import jax
import jax.numpy as jnp
import pytest

from kosmos_jax import ops, reference
from kosmos_jax.testing import fake_fused
from helpers import P, assert_close, fresh, mesh, put, shard_map


def _stand_in(op):
  def kernel(*args, cu_cap=None, config=None, **static):
    del cu_cap, config  # launch knobs: the twin has none
    return getattr(reference, op)(*[jax.lax.stop_gradient(a) for a in args], **static)
  return kernel


@pytest.fixture
def fused_stand_ins():
  with fake_fused({op: _stand_in(op) for op in ("matmul", "ag_tn", "tn_rs")}):
    yield


def _grads(f, cot, *args):
  """Gradient of <f(args), cot> with respect to every argument."""
  return jax.grad(lambda *a: jnp.vdot(f(*a), cot), argnums=tuple(range(len(args))))(*args)


def test_stand_in_alone_has_no_derivative():
  a, b = fresh((8, 16)), fresh((16, 4))
  da, db = _grads(lambda a, b: _stand_in("matmul")(a, b, layout="TN"), fresh((8, 4)), a, b)
  assert not jnp.any(da) and not jnp.any(db)


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_matmul_grad_and_jvp_are_the_twins(fused_stand_ins, layout):
  a = fresh((2, 8, 16) if layout != "NT" else (2, 8, 12))
  b = fresh({"TN": (16, 4), "NN": (4, 16), "NT": (2, 8, 4)}[layout])
  fused = lambda a, b: ops.matmul(a, b, layout=layout, impl="fused")
  twin = lambda a, b: reference.matmul(a, b, layout=layout)
  cot = fresh(jax.eval_shape(twin, a, b).shape)
  for got, want in zip(_grads(fused, cot, a, b), _grads(twin, cot, a, b)):
    assert_close(got, want, what=f"matmul {layout} grad")
  ta, tb = fresh(a.shape), fresh(b.shape)
  (y, ty), (y_ref, ty_ref) = jax.jvp(fused, (a, b), (ta, tb)), jax.jvp(twin, (a, b), (ta, tb))
  assert_close(y, y_ref, what=f"matmul {layout} value")
  assert_close(ty, ty_ref, what=f"matmul {layout} jvp")


@pytest.mark.parametrize("op", ["ag_tn", "tn_rs"])
def test_tp_op_grad_is_the_twins_under_shard_map(fused_stand_ins, op):
  tp = 2
  if op == "ag_tn":
    x, w = fresh((2, 16, 24)), fresh((24, 8 * tp))
    specs, out = (P(None, "tp", None), P(None, "tp")), P(None, None, "tp")
  else:
    x, w = fresh((2, 16, 24 * tp)), fresh((24 * tp, 8))
    specs, out = (P(None, None, "tp"), P("tp", None)), P(None, "tp", None)
  m = mesh(tp)
  args = [put(a, m, s) for a, s in zip((x, w), specs)]
  cot = fresh((2, 16, 8 * tp) if op == "ag_tn" else (2, 16, 8))

  def grads(impl):
    per_device = lambda x, w: getattr(ops, op)(x, w, axis_name="tp", impl=impl)
    return _grads(shard_map(per_device, m, specs, out), cot, *args)

  for got, want, name in zip(grads("fused"), grads("reference"), ("dx", "dw")):
    assert_close(got, want, what=f"{op} {name}")
