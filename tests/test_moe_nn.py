"""Flax NNX MoE module (and its Linen adapter) against the dense oracle built from its
own params, on Explicit and Auto meshes, with a dp axis; a jitted optax train step;
the recorded routing statistics; the Linen adapter's collections; constructor checks."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import flax.errors
import flax.linen
from flax import nnx

from helpers import P, assert_close, fresh
from kosmos_jax import moe
from kosmos_jax.nn import MoE, MoELinen, RoutingStat
from moe_oracle import DEEPSEEK, SOFTMAX, dense_moe

B, S = 4, 16
CFG = DEEPSEEK.replace(shared_expert_intermediate=8)


def make_mesh(kind, dp=2, ep=4):
  if kind == "explicit":
    return jax.make_mesh((dp, ep), ("dp", "ep"))
  return jax.sharding.Mesh(np.array(jax.devices()[: dp * ep]).reshape(dp, ep), ("dp", "ep"))


def params_of(model):
  names = ["router_w", "gate_up", "down", "shared_gate_up", "shared_down", "expert_bias"]
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
    assert model.gate_up[...].sharding.spec == P("ep", None, None, None)
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
    assert model.down[...].sharding.spec == P("ep", None, None)


def test_bf16_compute_dtype():
  m = make_mesh("auto", dp=1, ep=4)
  model = MoE(SOFTMAX, mesh=m, dtype=jnp.bfloat16, rngs=nnx.Rngs(3))
  assert model.gate_up[...].dtype == jnp.float32
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


def _skew(model, cfg):
  """Router weights that send nearly every token to expert 0 (beyond any capacity)."""
  rw = np.array(model.router_w[...]) * 0.1
  rw[0, 0] = 4.0
  model.router_w[...] = jnp.asarray(rw)


@pytest.mark.parametrize("skewed", [False, True])
def test_routing_stats_recorded(skewed):
  """Issue 24.4: each call records the whole batch's routing statistics in RoutingStat
  variables (counts summed over dp), updated under nnx.jit inside a train step."""
  m = make_mesh("auto", dp=2, ep=4)
  cfg = SOFTMAX.replace(capacity_factor=1.25)
  model = MoE(cfg, mesh=m, ep_axis="ep", dp_axis="dp", rngs=nnx.Rngs(4))
  assert not np.any(np.asarray(model.expert_counts[...]))
  x = np.array(fresh((B, S, cfg.hidden)))
  if skewed:
    _skew(model, cfg)
    x[..., 0] = np.abs(x[..., 0]) + 1.0
  x = jnp.asarray(x)

  @nnx.jit
  def step(mdl, x):
    def loss(mdl):
      y, aux = mdl(x)
      return jnp.mean(y ** 2) + aux
    return nnx.value_and_grad(loss)(mdl)

  _, grads = step(model, x)
  assert "expert_counts" not in grads  # a RoutingStat, not a Param
  idx = np.asarray(moe.route(x.reshape(-1, cfg.hidden), model.router_w[...], cfg).indices)
  counts = np.bincount(idx.ravel(), minlength=cfg.num_experts)
  np.testing.assert_array_equal(np.asarray(model.expert_counts[...]), counts)
  assert np.isclose(float(model.max_load[...]), counts.max() / counts.mean())
  # Rank (d, r) holds batch rows d of dp and sequence block r of ep; fill is its most
  # rows for one expert over the capacity, maxed over every rank.
  t_loc = B * S // 8
  ranks = idx.reshape(2, B // 2, 4, S // 4, cfg.top_k).transpose(0, 2, 1, 3, 4).reshape(8, -1)
  fill = max(np.bincount(r, minlength=cfg.num_experts).max() for r in ranks) / cfg.capacity(t_loc)
  assert np.isclose(float(model.capacity_fill[...]), fill)
  assert bool(model.dropless_fallback[...]) == (fill > 1)
  assert bool(model.dropless_fallback[...]) or not skewed
  stats = nnx.state(model, RoutingStat)
  assert set(nnx.to_pure_dict(stats)) == {"expert_counts", "max_load", "capacity_fill",
                                          "dropless_fallback"}


def test_linen_requires_expert_bias():
  """Issue 24.6: an apply without the ExpertBias collection used to route with a zero
  bias; it must raise instead, and an apply with it must use it."""
  m = make_mesh("auto", dp=1, ep=4)
  layer = MoELinen(CFG, mesh=m, ep_axis="ep")
  x = fresh((2, S, CFG.hidden))
  variables = layer.init(jax.random.key(0), x)
  with pytest.raises(ValueError, match=r"use_expert_bias=True but the variables have no "
                                       r"'ExpertBias' collection"):
    layer.apply({"params": variables["params"]}, x)
  bias = np.zeros(CFG.num_experts, np.float32)
  bias[3] = 10.0  # expert 3 in every token's top-k
  v = jax.tree.map(lambda a: a, flax.core.unfreeze(variables))
  v["ExpertBias"]["expert_bias"] = v["ExpertBias"]["expert_bias"].replace_boxed(jnp.asarray(bias))
  (y, _), state = layer.apply(v, x, mutable=["RoutingStat"])
  counts = np.asarray(flax.linen.unbox(state["RoutingStat"]["expert_counts"]))
  assert counts[3] == 2 * S  # every token chose it: the bias was used
  p = {k: jnp.asarray(np.asarray(flax.linen.unbox(a), np.float32)) for k, a in v["params"].items()}
  yr, _ = dense_moe(x.reshape(-1, CFG.hidden), {**p, "expert_bias": jnp.asarray(bias)}, CFG)
  assert_close(y, yr.reshape(x.shape), jnp.float32)


def test_module_construction_checks():
  m = make_mesh("auto", dp=1, ep=4)
  with pytest.raises(ValueError, match=r"MoE: impl='bogus' must be one of"):
    MoE(SOFTMAX, mesh=m, impl="bogus", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"MoE: use_bias=True is not supported"):
    MoE(SOFTMAX, mesh=m, use_bias=True, rngs=nnx.Rngs(0))
  model = MoE(SOFTMAX, mesh=m, precision=jax.lax.Precision.HIGHEST, rngs=nnx.Rngs(0))
  x = fresh((2, S, SOFTMAX.hidden))
  text = nnx.jit(lambda mdl, x: mdl(x)[0]).lower(model, x).as_text()
  dots = re.findall(r"stablehlo.dot_general.*", text)
  assert dots and all("HIGHEST" in d for d in dots)
  # Statistics need an NNX transform to be written; a plain jax.jit says so, and
  # record_stats=False runs there.
  with pytest.raises(flax.errors.TraceContextError, match=r"record_stats=False"):
    jax.jit(lambda x: model(x)[0])(x)
  quiet = MoE(SOFTMAX, mesh=m, record_stats=False, rngs=nnx.Rngs(0))
  assert jax.jit(lambda x: quiet(x)[0])(x).shape == x.shape
  assert not nnx.state(quiet, RoutingStat)
