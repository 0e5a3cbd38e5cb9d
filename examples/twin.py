"""The unsharded twin of examples/model.py: the same math with plain jnp matmuls on
one device, fed the same parameters and batches, to check the sharded training."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from kosmos_jax import moe as moe_lib
from model import causal_attention, cross_entropy, moe_config, rms_norm


def host_params(model):
  """The model's parameters as a nested dict of host NumPy arrays (gathered)."""
  state = nnx.state(model, nnx.Param)
  return jax.tree.map(lambda v: np.asarray(jax.device_get(v)), nnx.to_pure_dict(state))


def _cast(cfg, *arrays):
  """The layers' inputs and weights in the compute dtype, as Flax's dtype= promotes them."""
  return tuple(jnp.asarray(a).astype(cfg.dtype) for a in arrays)


def _mlp(cfg, p, x):
  x, gu, down = _cast(cfg, x, p["gate_up"], p["down"])
  return (jax.nn.silu(x @ gu[:, 0]) * (x @ gu[:, 1])) @ down


def _moe(cfg, p, x, dp: int):
  """Dense MoE: every expert on every token, weighted by the router (zero if not
  chosen); the aux loss per dp replica's tokens (the EP group), then averaged."""
  mcfg = moe_config(cfg)
  ys, auxes = [], []
  for xs in jnp.split(x, dp, axis=0):
    t, router_w, gate_up, down = _cast(cfg, xs.reshape(-1, cfg.hidden), p["router_w"], p["gate_up"], p["down"])
    r = moe_lib.route(t, router_w, mcfg)  # t [tokens, h]
    onehot = jax.nn.one_hot(r.indices, mcfg.num_experts, dtype=jnp.float32)  # [t, k, E]
    gate = jnp.einsum("tk,tke->te", r.weights, onehot)  # [t, E]
    g = jnp.einsum("th,ehi->eti", t, gate_up[:, :, 0])  # [E, t, I]
    u = jnp.einsum("th,ehi->eti", t, gate_up[:, :, 1])
    out = jnp.einsum("eti,eih->eth", jax.nn.silu(g) * u, down)  # [E, t, h]
    ys.append(jnp.einsum("te,eth->th", gate, out).reshape(xs.shape).astype(cfg.dtype))
    auxes.append(moe_lib.aux_loss(r, mcfg))
  return jnp.concatenate(ys, 0), jnp.mean(jnp.stack(auxes))


def forward(cfg, p, tokens, dp: int = 1):
  """(logits, aux loss) of the unsharded model; `dp` only groups the MoE aux loss."""
  x = p["embed"][tokens]
  aux = jnp.zeros((), jnp.float32)
  head_dim = cfg.hidden // cfg.heads
  for i in range(cfg.layers):
    b = p["blocks"][i]
    h, q, k, v, o = _cast(cfg, rms_norm(x, b["norm1"], cfg.eps),
                          *(b["attn"][n]["kernel"] for n in ("q", "k", "v", "o")))
    x = x + causal_attention(h @ q, h @ k, h @ v, head_dim) @ o
    h = rms_norm(x, b["norm2"], cfg.eps)
    if cfg.moe:
      y, a = _moe(cfg, b["ffn"], h, dp)
      x, aux = x + y, aux + a
    else:
      x = x + _mlp(cfg, b["ffn"], h)
  return rms_norm(x, p["norm"], cfg.eps) @ p["head"], aux


def loss(cfg, params, x, y, dp: int = 1) -> float:
  """The twin's loss at given host parameters on one batch (one device)."""
  logits, aux = forward(cfg, params, jnp.asarray(x), dp)
  return float(cross_entropy(logits, jnp.asarray(y)) + aux)


def train(cfg, params, data, steps: int, lr: float, dp: int = 1):
  """Same optimizer, same batches, one device: the loss curve to compare against."""
  dev = jax.devices()[0]
  params = jax.device_put(params, dev)
  opt = optax.adam(lr)
  state = opt.init(params)

  @jax.jit
  def step(params, state, x, y):
    def loss_fn(q):
      logits, aux = forward(cfg, q, x, dp)
      return cross_entropy(logits, y) + aux

    loss, g = jax.value_and_grad(loss_fn)(params)
    upd, state = opt.update(g, state, params)
    return optax.apply_updates(params, upd), state, loss

  losses = []
  for _ in range(steps):
    x, y = next(data)
    params, state, loss = step(params, state, jax.device_put(x, dev), jax.device_put(y, dev))
    losses.append(float(loss))
  return np.array(losses)
