"""TP+SP linears (custom_vjp) against the single-device dense oracle: forward and
jax.grad, fp32 (rel. error <= 1e-5) and bf16, tp = 1, 2, 4, 8, [batch, seq, hidden]."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kosmos_jax import tp as tp_lib
from helpers import P, assert_close, fresh, mesh, put

B, S, H, F = 2, 16, 12, 16  # batch, seq, hidden, intermediate (global)


def dense_pair(x, w1, w2):
  return jnp.tanh(x @ w1) @ w2


def sharded_pair(m, impl=None):
  def local(x, w1, w2):
    h = tp_lib.column_parallel_linear(x, w1, axis_name="tp", impl=impl)
    return tp_lib.row_parallel_linear(jnp.tanh(h), w2, axis_name="tp", impl=impl)

  dp = "dp" if "dp" in m.axis_names and m.shape["dp"] > 1 else None
  return jax.shard_map(local, mesh=m,
                       in_specs=(P(dp, "tp", None), P(None, "tp"), P("tp", None)),
                       out_specs=P(dp, "tp", None))


def inputs(dtype):
  return fresh((B, S, H), dtype), fresh((H, F), dtype, 0.3), fresh((F, H), dtype, 0.3)


def shard(m, x, w1, w2):
  dp = "dp" if m.shape.get("dp", 1) > 1 else None
  return (put(x, m, P(dp, "tp", None)), put(w1, m, P(None, "tp")), put(w2, m, P("tp", None)))


def loss_of(f):
  return lambda x, w1, w2: jnp.sum(jnp.sin(f(x, w1, w2).astype(jnp.float32)))


@pytest.mark.parametrize("tp,dp", [(1, 1), (2, 1), (4, 1), (8, 1), (4, 2)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_pair_forward_and_grad(tp, dp, dtype):
  m = mesh(tp, dp)
  x, w1, w2 = inputs(dtype)
  f = sharded_pair(m)
  y = jax.jit(f)(*shard(m, x, w1, w2))
  assert y.shape == (B, S, H) and y.dtype == dtype
  dense = lambda *a: dense_pair(*(t.astype(jnp.float32) for t in a))
  assert_close(y, dense(x, w1, w2), dtype, what="forward")
  grads = jax.jit(jax.grad(loss_of(f), argnums=(0, 1, 2)))(*shard(m, x, w1, w2))
  ref = jax.grad(loss_of(dense), argnums=(0, 1, 2))(x, w1, w2)
  for name, g, r in zip(("dx", "dw1", "dw2"), grads, ref):
    assert g.dtype == dtype
    assert_close(g, r, dtype, what=name)


def test_2d_inputs_without_batch():
  m = mesh(4)
  x, w1, w2 = fresh((S, H)), fresh((H, F)), fresh((F, H))
  f = jax.shard_map(lambda x, a, b: tp_lib.row_parallel_linear(
      tp_lib.column_parallel_linear(x, a, axis_name="tp"), b, axis_name="tp"), mesh=m,
      in_specs=(P("tp", None), P(None, "tp"), P("tp", None)), out_specs=P("tp", None))
  args = (put(x, m, P("tp", None)), put(w1, m, P(None, "tp")), put(w2, m, P("tp", None)))
  assert_close(jax.jit(f)(*args), np.asarray(x) @ np.asarray(w1) @ np.asarray(w2), jnp.float32)
  g = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2)))(*args)
  r = jax.grad(lambda x, a, b: jnp.sum((x @ a @ b) ** 2), argnums=(0, 1, 2))(x, w1, w2)
  for gi, ri in zip(g, r):
    assert_close(gi, ri, jnp.float32)


def test_swiglu_mlp_matches_dense():
  tp = 4
  m = mesh(tp)
  x, wgu, wd = fresh((B, S, H)), fresh((H, 2, F), scale=0.3), fresh((F, H), scale=0.3)
  specs = (P(None, "tp", None), P(None, None, "tp"), P("tp", None))
  f = jax.shard_map(lambda x, a, b: tp_lib.parallel_swiglu_mlp(x, a, b, axis_name="tp"), mesh=m,
                    in_specs=specs, out_specs=P(None, "tp", None))
  args = [put(a, m, s) for a, s in zip((x, wgu, wd), specs)]

  def dense(x, wgu, wd):
    return (jax.nn.silu(x @ wgu[:, 0]) * (x @ wgu[:, 1])) @ wd

  assert_close(jax.jit(f)(*args), dense(x, wgu, wd), jnp.float32)
  g = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2)))(*args)
  r = jax.grad(lambda *a: jnp.sum(dense(*a) ** 2), argnums=(0, 1, 2))(x, wgu, wd)
  for gi, ri in zip(g, r):
    assert_close(gi, ri, jnp.float32)
