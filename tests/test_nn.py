"""Flax modules: outputs against the dense oracle built from their own params, a
jitted optax train step with sharded params on Explicit and Auto meshes, the Linen
adapter."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import flax.linen
from flax import nnx

from kosmos_jax import nn as knn
from helpers import P, assert_close, fresh

B, S, H, I = 4, 16, 16, 32


def make_mesh(kind, dp=2, tp=4):
  if kind == "explicit":
    return jax.make_mesh((dp, tp), ("dp", "tp"))
  devs = np.array(jax.devices()[: dp * tp]).reshape(dp, tp)
  return jax.sharding.Mesh(devs, ("dp", "tp"))


def np_(a):
  return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_linears_match_dense(kind):
  m = make_mesh(kind)
  with jax.set_mesh(m):
    col = knn.ColumnParallelLinear(H, I, mesh=m, dp_axis="dp", use_bias=True, rngs=nnx.Rngs(0))
    row = knn.RowParallelLinear(I, H, mesh=m, dp_axis="dp", use_bias=True,
                                bias_init=nnx.initializers.normal(1.0), rngs=nnx.Rngs(1))
    assert col.kernel[...].sharding.spec == P(None, "tp")
    assert row.kernel[...].sharding.spec == P("tp", None)
    x = fresh((B, S, H))
    y = nnx.jit(lambda c, r, x: r(jnp.tanh(c(x))))(col, row, x)
    assert y.shape == (B, S, H)
    assert tuple(y.sharding.spec)[:2] == ("dp", "tp")
  h = np.tanh(np_(x) @ np_(col.kernel[...]) + np_(col.bias[...]))
  assert_close(y, h @ np_(row.kernel[...]) + np_(row.bias[...]), jnp.float32)


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_mlp_train_step_sharded(kind):
  m = make_mesh(kind)
  with jax.set_mesh(m):
    model = knn.ParallelMLP(H, I, mesh=m, dp_axis="dp", rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x, target = fresh((B, S, H)), fresh((B, S, H))

    @nnx.jit
    def step(model, opt, x, t):
      loss, grads = nnx.value_and_grad(lambda mdl: jnp.mean((mdl(x) - t) ** 2))(model)
      opt.update(model, grads)
      return loss

    losses = [float(step(model, opt, x, target)) for _ in range(8)]
    assert losses[-1] < losses[0], losses
    assert model.gate_up[...].sharding.spec == P(None, None, "tp")
    assert model.down[...].sharding.spec == P("tp", None)


def test_mlp_grads_match_dense():
  m = make_mesh("auto", dp=1, tp=4)
  model = knn.ParallelMLP(H, I, mesh=m, rngs=nnx.Rngs(3))
  x = fresh((2, S, H))
  grads = nnx.jit(nnx.grad(lambda mdl: jnp.sum(mdl(x) ** 2)))(model)
  gu, dn = jnp.asarray(np.asarray(model.gate_up[...])), jnp.asarray(np.asarray(model.down[...]))

  def dense(gu, dn):
    return jnp.sum(((jax.nn.silu(x @ gu[:, 0]) * (x @ gu[:, 1])) @ dn) ** 2)

  rg = jax.grad(dense, argnums=(0, 1))(gu, dn)
  assert_close(grads["gate_up"][...], rg[0], jnp.float32, what="d gate_up")
  assert_close(grads["down"][...], rg[1], jnp.float32, what="d down")


def test_bf16_compute_dtype():
  m = make_mesh("auto", dp=1, tp=4)
  model = knn.ParallelMLP(H, I, mesh=m, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  assert model.down[...].dtype == jnp.float32  # param_dtype stays fp32
  x = fresh((2, S, H))
  y = nnx.jit(lambda mdl, x: mdl(x))(model, x)
  assert y.dtype == jnp.bfloat16
  gu, dn = np_(model.gate_up[...]), np_(model.down[...])
  g, u = np_(x) @ gu[:, 0], np_(x) @ gu[:, 1]
  assert_close(y, (g / (1 + np.exp(-g)) * u) @ dn, jnp.bfloat16)


def test_linen_adapter():
  m = make_mesh("auto", dp=1, tp=4)
  layer = knn.ParallelMLPLinen(H, I, mesh=m)
  x = fresh((2, S, H))
  variables = layer.init(jax.random.key(0), x)
  y = jax.jit(layer.apply)(variables, x)
  params = variables["params"]
  gu, dn = np_(flax.linen.unbox(params["gate_up"])), np_(flax.linen.unbox(params["down"]))
  g, u = np_(x) @ gu[:, 0], np_(x) @ gu[:, 1]
  assert_close(y, (g / (1 + np.exp(-g)) * u) @ dn, jnp.float32)
  grads = jax.jit(jax.grad(lambda v: jnp.sum(layer.apply(v, x) ** 2)))(variables)
  assert np.all(np.isfinite(np_(flax.linen.unbox(grads["params"]["down"]))))
