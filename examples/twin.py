"""The unsharded twin of examples/model.py: the same math with plain jnp matmuls on
one device, fed the same parameters and batches, to check the sharded training."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from model import causal_attention, cross_entropy, rms_norm


def host_params(model):
  """The model's parameters as a nested dict of host NumPy arrays (gathered)."""
  state = nnx.state(model, nnx.Param)
  return jax.tree.map(lambda v: np.asarray(jax.device_get(v)), nnx.to_pure_dict(state))


def _mlp(p, x):
  gu, down = p["gate_up"], p["down"]
  return (jax.nn.silu(x @ gu[:, 0]) * (x @ gu[:, 1])) @ down


def forward(cfg, p, tokens):
  x = p["embed"][tokens]
  head_dim = cfg.hidden // cfg.heads
  for i in range(cfg.layers):
    b = p["blocks"][i]
    h = rms_norm(x, b["norm1"], cfg.eps)
    a = causal_attention(h @ b["attn"]["q"]["kernel"], h @ b["attn"]["k"]["kernel"],
                         h @ b["attn"]["v"]["kernel"], head_dim)
    x = x + a @ b["attn"]["o"]["kernel"]
    if cfg.moe:
      raise NotImplementedError("the dense twin of the MoE block lives in kosmos_jax's MoE oracle")
    x = x + _mlp(b["ffn"], rms_norm(x, b["norm2"], cfg.eps))
  return rms_norm(x, p["norm"], cfg.eps) @ p["head"]


def train(cfg, params, data, steps: int, lr: float):
  """Same optimizer, same batches, one device: the loss curve to compare against."""
  dev = jax.devices()[0]
  params = jax.device_put(params, dev)
  opt = optax.adam(lr)
  state = opt.init(params)

  @jax.jit
  def step(params, state, x, y):
    loss, g = jax.value_and_grad(lambda q: cross_entropy(forward(cfg, q, x), y))(params)
    upd, state = opt.update(g, state, params)
    return optax.apply_updates(params, upd), state, loss

  losses = []
  for _ in range(steps):
    x, y = next(data)
    params, state, loss = step(params, state, jax.device_put(x, dev), jax.device_put(y, dev))
    losses.append(float(loss))
  return np.array(losses)
