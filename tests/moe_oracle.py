"""Test-side oracles for the MoE layer: a NumPy transcription of each routing rule
and a single-device dense layer (a loop over experts, no parallelism, no capacity),
plus a runner of kosmos_jax.moe.moe_layer under shard_map. Shared by test_moe_*.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from helpers import fresh, put
from kosmos_jax.moe import MoEConfig, RoutingStats, moe_layer

SOFTMAX = MoEConfig(num_experts=8, top_k=2, hidden=16, expert_intermediate=8, score="softmax",
                    aux_loss_coeff=0.1)
DEEPSEEK = MoEConfig(num_experts=16, top_k=4, hidden=16, expert_intermediate=8, score="sigmoid",
                     norm_topk_prob=True, n_groups=4, topk_groups=2, route_scale=2.5,
                     use_expert_bias=True, aux_loss_coeff=0.1)
LLAMA4 = MoEConfig(num_experts=8, top_k=1, hidden=16, expert_intermediate=8, score="sigmoid",
                   gating="input", shared_expert_intermediate=8)  # Llama 4's rule, small
ROUTINGS = {"softmax": SOFTMAX, "deepseek": DEEPSEEK, "llama4": LLAMA4}
NAMES = ("router_w", "gate_up", "down", "shared_gate_up", "shared_down", "expert_bias")


def np_route(x, router_w, cfg: MoEConfig, bias=None):
  """Per-token NumPy (float64) transcription of the routing rule -> (idx, weights, logits)."""
  logits = np.asarray(x, np.float64) @ np.asarray(router_w, np.float64)
  t, e = logits.shape
  idx = np.zeros((t, cfg.top_k), np.int64)
  w = np.zeros((t, cfg.top_k))
  for i in range(t):
    z = logits[i]
    s = np.exp(z - z.max()) / np.exp(z - z.max()).sum() if cfg.score == "softmax" else 1 / (1 + np.exp(-z))
    c = s + (np.asarray(bias, np.float64) if bias is not None else 0.0)
    eligible = list(range(e))
    if cfg.n_groups > 1:
      per = e // cfg.n_groups
      gscore = [sum(sorted(c[g * per:(g + 1) * per])[-2:]) for g in range(cfg.n_groups)]
      keep = sorted(range(cfg.n_groups), key=lambda g: (-gscore[g], g))[:cfg.topk_groups]
      eligible = [x for x in range(e) if x // per in keep]
    chosen = sorted(eligible, key=lambda x: (-c[x], x))[:cfg.top_k]  # ties: lower id first
    idx[i] = chosen
    w[i] = s[chosen] / (s[chosen].sum() if cfg.norm_topk_prob else 1.0) * cfg.route_scale
  return idx, w, logits


def _swiglu_ffn(x, gate_up, down):
  """gate_up [h, 2, I]: index 0 is the gate, 1 the up projection."""
  return (jax.nn.silu(x @ gate_up[:, 0]) * (x @ gate_up[:, 1])) @ down


def np_llama4_moe(x, p, cfg: MoEConfig):
  """Per-token NumPy (float64) transcription of Llama4TextMoe: top-k of the router
  logits, each chosen expert's *input* scaled by sigmoid(logit), the expert outputs
  summed unweighted, plus the shared expert on the unscaled token."""
  f64 = lambda a: np.asarray(jnp.asarray(a, jnp.float32), np.float64)
  x, rw, gu, dn = f64(x), f64(p["router_w"]), f64(p["gate_up"]), f64(p["down"])

  def ffn(v, gate_up, down):
    g, u = v @ gate_up[:, 0], v @ gate_up[:, 1]
    return (g / (1 + np.exp(-g)) * u) @ down

  y = np.zeros_like(x)
  for i in range(x.shape[0]):
    z = x[i] @ rw
    for e in sorted(range(z.shape[0]), key=lambda e: (-z[e], e))[:cfg.top_k]:
      y[i] += ffn(x[i] / (1 + np.exp(-z[e])) * cfg.route_scale, gu[e], dn[e])
    if cfg.shared_expert_intermediate:
      y[i] += ffn(x[i], f64(p["shared_gate_up"]), f64(p["shared_down"]))
  return y


def dense_moe(x, p: dict, cfg: MoEConfig):
  """Dense oracle, fp32, differentiable: y [T, h], aux []. Every token runs through
  every expert; the token's combine weight for that expert (0 if not chosen) scales
  the expert's output, or with gating='input' its input (a SwiGLU maps 0 to 0)."""
  logits = x @ p["router_w"]
  s = jax.nn.softmax(logits, -1) if cfg.score == "softmax" else jax.nn.sigmoid(logits)
  c = jax.lax.stop_gradient(s) + (p["expert_bias"] if cfg.use_expert_bias else 0.0)
  t, e = s.shape
  if cfg.n_groups > 1:
    per = e // cfg.n_groups
    gs = jnp.sort(c.reshape(t, cfg.n_groups, per), axis=-1)[..., -2:].sum(-1)
    keep = jnp.argsort(-gs, axis=-1, stable=True)[:, :cfg.topk_groups]
    mask = (jnp.arange(e)[None, None, :] // per == keep[:, :, None]).any(1)
    c = jnp.where(mask, c, -jnp.inf)
  idx = jnp.argsort(-c, axis=-1, stable=True)[:, :cfg.top_k]
  w = jnp.take_along_axis(s, idx, -1)
  if cfg.norm_topk_prob:
    w = w / w.sum(-1, keepdims=True)
  w = w * cfg.route_scale
  y = jnp.zeros_like(x)
  for ex in range(e):
    coef = jnp.sum(jnp.where(idx == ex, w, 0.0), -1)
    if cfg.gating == "input":
      y = y + _swiglu_ffn(coef[:, None] * x, p["gate_up"][ex], p["down"][ex])
    else:
      y = y + coef[:, None] * _swiglu_ffn(x, p["gate_up"][ex], p["down"][ex])
  if cfg.shared_expert_intermediate:
    y = y + _swiglu_ffn(x, p["shared_gate_up"], p["shared_down"])
  probs = s if cfg.score == "softmax" else s / s.sum(-1, keepdims=True)
  f = jax.nn.one_hot(idx, e).sum((0, 1)) / (t * cfg.top_k)
  return y, cfg.aux_loss_coeff * e * jnp.sum(f * probs.mean(0))


def make_params(cfg: MoEConfig, dtype, shared: bool):
  e, h, i = cfg.num_experts, cfg.hidden, cfg.expert_intermediate
  p = {"router_w": fresh((h, e), dtype, 0.5), "gate_up": fresh((e, h, 2, i), dtype, h ** -0.5),
       "down": fresh((e, i, h), dtype, i ** -0.5)}
  if shared:
    si = cfg.shared_expert_intermediate
    p["shared_gate_up"] = fresh((h, 2, si), dtype, h ** -0.5)
    p["shared_down"] = fresh((si, h), dtype, si ** -0.5)
  if cfg.use_expert_bias:
    p["expert_bias"] = fresh((e,), jnp.float32, 0.05)
  return p


def ep_mesh(ep: int):
  return jax.sharding.Mesh(np.array(jax.devices()[:ep]), ("ep",))


SPECS = {"router_w": P(), "gate_up": P("ep"), "down": P("ep"), "shared_gate_up": P(),
         "shared_down": P(), "expert_bias": P()}


def sharded_layer(cfg: MoEConfig, ep: int, names, impl=None, stats=False):
  """Jitted (x [T, h], *params) -> (y, aux) (+ RoutingStats with stats=True) over an EP
  mesh of `ep` devices, and the mesh."""
  m = ep_mesh(ep)

  def local(x, *params):
    return moe_layer(x, dict(zip(names, params)), cfg, axis_name="ep", impl=impl, return_stats=stats)

  outs = (P("ep"), P()) + ((RoutingStats(P(), P(), P(), P()),) if stats else ())
  f = jax.shard_map(local, mesh=m, in_specs=(P("ep"), *[SPECS[n] for n in names]), out_specs=outs)
  return jax.jit(f), m


def place(m, x, p: dict):
  names = tuple(n for n in NAMES if n in p)
  return names, put(x, m, P("ep")), [put(p[n], m, SPECS[n]) for n in names]


def layer_grads(cfg: MoEConfig, m, x, p: dict, cot, impl=None, cu_cap=None) -> dict:
  """jax.grad of moe_layer (loss <y, cot> + aux) under shard_map over mesh m's "ep" axis:
  {name: gradient} of x and every parameter in p (unplaced arrays in)."""
  names = tuple(n for n in NAMES if n in p)

  def local(cot, x, *ps):
    def loss(x, *ps):
      y, aux = moe_layer(x, dict(zip(names, ps)), cfg, axis_name="ep", impl=impl, cu_cap=cu_cap)
      return jnp.sum(y.astype(jnp.float32) * cot) + aux
    return jax.grad(loss, argnums=tuple(range(len(names) + 1)))(x, *ps)

  specs = (P("ep"), *[SPECS[n] for n in names])
  f = jax.jit(jax.shard_map(local, mesh=m, in_specs=(P("ep"), *specs), out_specs=specs))
  _, xs, ps = place(m, x, p)
  return dict(zip(("x",) + names, f(put(cot, m, P("ep")), xs, *ps)))


def to_f32(p: dict):
  return {k: jnp.asarray(np.asarray(jnp.asarray(v, jnp.float32))) for k, v in p.items()}
