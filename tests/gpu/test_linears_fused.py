"""The TP+SP linears on the fused kernels, both directions: column_parallel_linear
runs kosmos_ag_tn forward and kosmos_bulk_ag_nn + kosmos_bulk_rs_nt backward;
row_parallel_linear runs kosmos_tn_rs forward and kosmos_ag_nn (+ the NT weight
gradient) backward, with impl="fused", against impl="reference" and a float64
oracle, with the Hopper builders counted. tp = 1 runs on one GPU; tp = 2 needs two
(the one-GPU loopback tests, test_loopback.py, cover the ranks' protocol)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kosmos_jax import tp
from kosmos_jax.testing import builder_runs
from helpers import P, assert_close, fresh, gpu_mesh, put, shard_map

BF16 = jnp.bfloat16


def _oracle(x, w):
  return np.asarray(jnp.asarray(x, jnp.float32), np.float64) @ np.asarray(jnp.asarray(w, jnp.float32), np.float64)


def _check_forward_fused(linear, op, x, w, xs, ws, ys):
  """`linear` with impl="fused" runs `op`'s Hopper builders once per rank and
  matches impl="reference" and the float64 oracle."""
  mesh = gpu_mesh(2, hopper=True)
  run = lambda impl: shard_map(lambda a, b: linear(a, b, "tp", impl=impl), mesh,
                               in_specs=(xs, ws), out_specs=ys)(put(x, mesh, xs), put(w, mesh, ws))
  before = builder_runs()[op]["sm90"]
  y = run("fused")
  assert builder_runs()[op]["sm90"] - before == 2
  name = linear.__name__.replace("_parallel_linear", "")
  assert_close(y, run("reference"), BF16, what=f"{name} linear fused vs reference")
  assert_close(y, _oracle(x, w), BF16, what=f"{name} linear fused vs oracle")


def test_column_parallel_linear_forward_fused():
  x, w = fresh((2, 512, 256), BF16), fresh((256, 768), BF16, scale=256 ** -0.5)
  _check_forward_fused(tp.column_parallel_linear, "ag_tn", x, w, P(None, "tp", None), P(None, "tp"),
                       P(None, None, "tp"))


def test_row_parallel_linear_forward_fused():
  x, w = fresh((2, 512, 512), BF16), fresh((512, 256), BF16, scale=512 ** -0.5)
  _check_forward_fused(tp.row_parallel_linear, "tn_rs", x, w, P(None, None, "tp"), P("tp", None),
                       P(None, "tp", None))


BWD_OPS = ("ag_tn", "tn_rs", "ag_nn", "bulk_ag_nn", "bulk_rs_nt")


def _pair_grads(impl, mesh, x, w1, w2):
  """Gradients of a column/row pair (the MLP of a TP+SP block) under `impl`."""
  def loss(a, b, c):
    h = tp.column_parallel_linear(a, b, axis_name="tp", impl=impl)
    y = tp.row_parallel_linear(jax.nn.gelu(h), c, axis_name="tp", impl=impl)
    return jnp.sum(y.astype(jnp.float32) ** 2)
  specs = (P(None, "tp", None), P(None, "tp"), P("tp", None))
  f = shard_map(jax.grad(loss, argnums=(0, 1, 2)), mesh, in_specs=specs, out_specs=specs)
  return f(*(put(a, mesh, sp) for a, sp in zip((x, w1, w2), specs)))


@pytest.mark.parametrize("tp_size", [1, 2])
def test_pair_trains_fused_in_both_directions(tp_size):
  mesh = gpu_mesh(tp_size, hopper=True)
  x = fresh((2, 512, 256), BF16)
  w1, w2 = fresh((256, 512), BF16, scale=256 ** -0.5), fresh((512, 256), BF16, scale=512 ** -0.5)
  before = builder_runs()
  got = _pair_grads("fused", mesh, x, w1, w2)
  after = builder_runs()
  for op in BWD_OPS:  # every op of both directions ran fused, on the Hopper builders, once per rank
    assert after[op]["sm90"] - before[op]["sm90"] == tp_size, (op, before[op], after[op])
  want = _pair_grads("reference", mesh, x, w1, w2)
  for name, g, r in zip(("dx", "dw1", "dw2"), got, want):
    assert_close(g, r, BF16, what=f"{name} fused vs reference (tp={tp_size})")
  again = _pair_grads("fused", mesh, x, w1, w2)
  for name, g, h in zip(("dx", "dw1", "dw2"), got, again):  # every reduction sums in a fixed order
    assert np.array_equal(np.asarray(g, np.float32), np.asarray(h, np.float32)), f"{name} moved between runs"


def test_fused_backward_portable_builders_fp32():
  # fp32 runs the portable builders of every op (no Hopper engine for fp32).
  mesh = gpu_mesh(1)
  x = fresh((1, 256, 128), jnp.float32)
  w1, w2 = fresh((128, 192), jnp.float32, scale=0.1), fresh((192, 128), jnp.float32, scale=0.1)
  before = builder_runs()
  got = _pair_grads("fused", mesh, x, w1, w2)
  after = builder_runs()
  for op in BWD_OPS:
    assert after[op]["portable"] - before[op]["portable"] == 1, (op, before[op], after[op])
  # XLA's own fp32 dots may round through TF32 on the GPU; the fused ones do not.
  with jax.default_matmul_precision("highest"):
    want = _pair_grads("reference", mesh, x, w1, w2)
  for name, g, r in zip(("dx", "dw1", "dw2"), got, want):
    assert_close(g, r, jnp.float32, what=f"{name} fused fp32 vs reference")


def test_fused_ag_nn_needs_16_byte_rows():
  mesh = gpu_mesh(1)
  dy, w = fresh((128, 12), BF16), fresh((64, 12), BF16)  # 24-byte rows
  from kosmos_jax import ops
  f = shard_map(lambda a, b: ops.ag_nn(a, b, axis_name="tp", impl="fused"), mesh,
                in_specs=(P("tp", None), P()), out_specs=P())
  with pytest.raises(ValueError, match="multiple of 16 bytes"):
    f(put(dy, mesh, P("tp", None)), put(w, mesh, P()))
