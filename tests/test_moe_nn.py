"""Flax NNX MoE module (and its Linen adapter) against the dense oracle built from its
own params, on Explicit and Auto meshes, with a dp axis; a jitted optax train step."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import flax.linen
from flax import nnx

from helpers import P, assert_close, fresh
from kosmos_jax.nn.moe import MoE, MoELinen
from moe_oracle import DEEPSEEK, SOFTMAX, dense_moe

B, S = 4, 16
CFG = DEEPSEEK.replace(shared_expert_intermediate=8)


def make_mesh(kind, dp=2, ep=4):
  if kind == "explicit":
    return jax.make_mesh((dp, ep), ("dp", "ep"))
  return jax.sharding.Mesh(np.array(jax.devices()[: dp * ep]).reshape(dp, ep), ("dp", "ep"))


def params_of(model):
  names = ["router_w", "w1", "w2", "shared_w1", "shared_w2", "expert_bias"]
  return {n: jnp.asarray(np.asarray(getattr(model, n)[...], np.float32))
          for n in names if getattr(model, n, None) is not None}


def oracle(x, p, cfg, dp):
  """Per-dp-group dense layer: the aux loss is over each EP group's tokens, then averaged."""
  xs = np.asarray(jnp.asarray(x, jnp.float32)).reshape(dp, -1, cfg.hidden)
  outs = [dense_moe(jnp.asarray(g), p, cfg) for g in xs]
  y = jnp.concatenate([o[0] for o in outs]).reshape(x.shape)
  return y, jnp.mean(jnp.stack([o[1] for o in outs]))


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_moe_matches_dense(kind):
  m = make_mesh(kind)
  with jax.set_mesh(m):
    model = MoE(CFG, mesh=m, ep_axis="ep", dp_axis="dp", rngs=nnx.Rngs(0))
    model.expert_bias[...] = fresh((CFG.num_experts,), scale=0.05)
    assert model.w1[...].sharding.spec == P("ep", None, None)
    assert model.router_w[...].sharding.spec == P(None, None)
    x = fresh((B, S, CFG.hidden))
    y, aux = nnx.jit(lambda mdl, x: mdl(x))(model, x)
    assert y.shape == x.shape and tuple(y.sharding.spec)[:2] == ("dp", "ep")
  yr, auxr = oracle(x, params_of(model), CFG, dp=2)
  assert_close(y, yr, jnp.float32, what="y")
  assert_close(aux, auxr, jnp.float32, what="aux")


def test_moe_grads_match_dense():
  m = make_mesh("auto", dp=1, ep=4)
  model = MoE(CFG, mesh=m, ep_axis="ep", rngs=nnx.Rngs(1))
  x, cot = fresh((2, S, CFG.hidden)), fresh((2, S, CFG.hidden))

  def loss(mdl):
    y, aux = mdl(x)
    return jnp.sum(y * cot) + aux

  grads = nnx.jit(nnx.grad(loss))(model)
  p = params_of(model)
  dp_ = {k: v for k, v in p.items() if k != "expert_bias"}

  def oloss(q):
    y, aux = dense_moe(x.reshape(-1, CFG.hidden), {**q, "expert_bias": p["expert_bias"]}, CFG)
    return jnp.sum(y.reshape(x.shape) * cot) + aux

  ref = jax.grad(oloss)(dp_)
  assert "expert_bias" not in grads  # not an nnx.Param: no gradient, no optimizer update
  for name, g in ref.items():
    assert_close(grads[name][...], g, jnp.float32, what=f"d{name}")


def test_moe_train_step_explicit_mesh():
  m = make_mesh("explicit")
  cfg = SOFTMAX
  with jax.set_mesh(m):
    model = MoE(cfg, mesh=m, ep_axis="ep", dp_axis="dp", rngs=nnx.Rngs(2))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x, target = fresh((B, S, cfg.hidden)), fresh((B, S, cfg.hidden))

    @nnx.jit
    def step(model, opt, x, t):
      def loss(mdl):
        y, aux = mdl(x)
        return jnp.mean((y - t) ** 2) + aux
      value, grads = nnx.value_and_grad(loss)(model)
      opt.update(model, grads)
      return value

    losses = [float(step(model, opt, x, target)) for _ in range(6)]
    assert losses[-1] < losses[0], losses
    assert model.w2[...].sharding.spec == P("ep", None, None)


def test_bf16_compute_dtype():
  m = make_mesh("auto", dp=1, ep=4)
  model = MoE(SOFTMAX, mesh=m, dtype=jnp.bfloat16, rngs=nnx.Rngs(3))
  assert model.w1[...].dtype == jnp.float32
  x = fresh((2, S, SOFTMAX.hidden))
  y, aux = nnx.jit(lambda mdl, x: mdl(x))(model, x)
  assert y.dtype == jnp.bfloat16 and aux.dtype == jnp.float32
  p = {k: v.astype(jnp.bfloat16).astype(jnp.float32) for k, v in params_of(model).items()}
  xb = x.astype(jnp.bfloat16).astype(jnp.float32)
  yr, _ = dense_moe(xb.reshape(-1, SOFTMAX.hidden), p, SOFTMAX)
  assert_close(y, yr.reshape(x.shape), jnp.bfloat16)


def test_linen_adapter():
  m = make_mesh("auto", dp=1, ep=4)
  layer = MoELinen(CFG, mesh=m, ep_axis="ep")
  x = fresh((2, S, CFG.hidden))
  variables = layer.init(jax.random.key(0), x)
  y, aux = jax.jit(layer.apply)(variables, x)
  p = {k: jnp.asarray(np.asarray(flax.linen.unbox(v), np.float32))
       for k, v in variables["params"].items()}
  p["expert_bias"] = jnp.zeros((CFG.num_experts,))
  yr, auxr = dense_moe(x.reshape(-1, CFG.hidden), p, CFG)
  assert_close(y, yr.reshape(x.shape), jnp.float32)
  assert_close(aux, auxr, jnp.float32)


def test_module_errors():
  m = make_mesh("auto", dp=1, ep=4)
  with pytest.raises(ValueError, match=r"num_experts=6 must be divisible by the 'ep' axis size ep=4"):
    MoE(SOFTMAX.replace(num_experts=6), mesh=m, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"ep_axis='tp' is not an axis of the mesh"):
    MoE(SOFTMAX, mesh=m, ep_axis="tp", rngs=nnx.Rngs(0))
  model = MoE(SOFTMAX, mesh=m, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"x.shape\[-1\]=12 must equal in_features=16"):
    model(jnp.zeros((2, S, 12)))
  with pytest.raises(ValueError, match=r"seq=6 must be a multiple of the 'ep' axis size 4"):
    model(jnp.zeros((2, 6, 16)))
