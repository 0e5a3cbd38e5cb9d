"""Router: scores, (group-limited) top-k, combine weights and the aux-loss inputs.

The paper's step 1 ("Route", §3.3.1): logits X·Wr in FP32, score, top-k,
dispatch weights and the aux-loss inputs, all per token block. Pure JAX; the
reference layer and (later) the megakernel share these semantics. It sits with the
reference twin so that nothing at this floor imports the layer above it.

Ties are broken toward the lower expert id (and the lower group id): jax.lax.top_k
returns the lower index first among equal values, and masking uses -inf, which
never ties with a finite score.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from kosmos_jax import _compat
from kosmos_jax.reference.moe_config import MoEConfig


class Routing(NamedTuple):
  indices: jax.Array   # [t, k] int32, expert ids, best first
  weights: jax.Array   # [t, k] fp32 combine weights (normalized, scaled)
  logits: jax.Array    # [t, E] fp32 router logits (the backward differentiates through these)
  counts: jax.Array    # [E] int32 (token, slot) assignments per expert on this rank (aux f_i)
  prob_sum: jax.Array  # [E] fp32 sum over this rank's tokens of the aux probabilities (aux P_i)


def scores(logits, config: MoEConfig):
  """[t, E] fp32 scores: softmax over experts, or elementwise sigmoid."""
  if config.score == "softmax":
    return jax.nn.softmax(logits, axis=-1)
  return jax.nn.sigmoid(logits)


def aux_probs(logits, config: MoEConfig):
  """[t, E] per-token probabilities P of the balance loss. For sigmoid scores they
  are normalized to sum to 1 per token (DeepSeek-V3's balance-loss convention)."""
  s = scores(logits, config)
  if config.score == "sigmoid":
    s = s / jnp.sum(s, axis=-1, keepdims=True)
  return s


def select(logits, config: MoEConfig, bias=None):
  """[t, k] int32 expert ids: top-k of (score + bias), restricted to the best
  `topk_groups` of `n_groups` groups (group score = sum of its top-2 entries)."""
  return pick(scores(logits, config), top_k=config.top_k, n_groups=config.n_groups,
              topk_groups=config.topk_groups, bias=bias)


def pick(score, *, top_k: int, n_groups: int, topk_groups: int, bias=None):
  """select's ids from the scores [t, E] (the fused forward's selection kernel, whose
  contract this is, takes the same: kosmos_jax/ops/_fused_moe.py select_experts)."""
  choice = score
  if bias is not None:
    choice = choice + bias.astype(jnp.float32)[None, :]  # selection only, never the weights
  t, e = choice.shape
  if n_groups > 1:
    grouped = choice.reshape(t, n_groups, e // n_groups)  # [t, G, E/G]
    top2, _ = jax.lax.top_k(grouped, 2)
    _, keep = jax.lax.top_k(jnp.sum(top2, axis=-1), topk_groups)  # [t, topk_groups]
    kept = jnp.any(keep[:, :, None] == jnp.arange(n_groups)[None, None, :], axis=1)
    choice = jnp.where(kept[:, :, None], grouped, -jnp.inf).reshape(t, e)
  _, idx = jax.lax.top_k(choice, top_k)
  return idx.astype(jnp.int32)


def combine_weights(logits, indices, config: MoEConfig):
  """[t, k] fp32 combine weights from the *unbiased* scores of the chosen experts.
  A differentiable function of `logits` for fixed `indices`: the backward takes
  its VJP (the router-weight gradient through the score function)."""
  w = jnp.take_along_axis(scores(logits, config), indices, axis=-1)
  if config.norm_topk_prob:
    w = w / jnp.sum(w, axis=-1, keepdims=True)
  return w * jnp.float32(config.route_scale)


def route(x, router_w, config: MoEConfig, bias=None, *, precision=None, selector=select) -> Routing:
  """Route tokens x [t, hidden] with router_w [hidden, E]; bias [E] (selection only);
  precision: of the logits dot (jax.lax.Precision), None = JAX's default; selector:
  select, or a function computing the same ids (the fused forward's kernel)."""
  if x.shape[-1] != router_w.shape[0] or router_w.shape[0] != config.hidden:
    raise ValueError(f"route: x.shape={tuple(x.shape)} and router_w.shape={tuple(router_w.shape)} "
                     f"must agree with hidden={config.hidden}")
  if router_w.shape[1] != config.num_experts:
    raise ValueError(f"route: router_w.shape[1]={router_w.shape[1]} must equal "
                     f"num_experts={config.num_experts}")
  if config.use_expert_bias and bias is None:
    raise ValueError("route: config.use_expert_bias=True needs bias=[num_experts] array, got None")
  if bias is not None and tuple(bias.shape) != (config.num_experts,):
    raise ValueError(f"route: bias.shape={tuple(bias.shape)} must be ({config.num_experts},)")
  # FP32 logits whatever the operand dtype (bf16 products are exact in fp32).
  logits = jnp.einsum("th,he->te", x, router_w, preferred_element_type=jnp.float32,
                      precision=precision)
  logits = logits.astype(jnp.float32)
  idx = jax.lax.stop_gradient(selector(logits, config, bias if config.use_expert_bias else None))
  weights = combine_weights(logits, idx, config)
  counts = jnp.zeros((config.num_experts,), jnp.int32).at[idx.reshape(-1)].add(1)
  prob_sum = jnp.sum(aux_probs(logits, config), axis=0)
  return Routing(idx, weights, logits, counts, prob_sum)


def aux_loss(routing: Routing, config: MoEConfig, axis_name=None):
  """Switch/GShard balance loss coeff * E * sum_i f_i P_i over the tokens of the
  EP group (`axis_name`; None = this rank only): f_i = share of (token, slot)
  assignments to expert i (not differentiated), P_i = mean aux probability.
  Exactly 0 when config.aux_loss_coeff is 0, even where a token's logits are NaN."""
  if not config.aux_loss_coeff:
    return jnp.zeros((), jnp.float32)
  counts, prob_sum = routing.counts.astype(jnp.float32), routing.prob_sum
  t = jnp.float32(routing.logits.shape[0])
  if axis_name is not None:
    counts = jax.lax.psum(counts, axis_name)
    prob_sum = jax.lax.psum(prob_sum, axis_name)
    t = t * _compat.axis_size(axis_name)
  f = jax.lax.stop_gradient(counts / (t * config.top_k))
  return jnp.float32(config.aux_loss_coeff * config.num_experts) * jnp.sum(f * prob_sum / t)
