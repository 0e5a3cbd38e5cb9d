"""Functional expert-parallel MoE layer with a custom_vjp over the whole layer.

The rule's forward / backward are exactly the two per-device ops the megakernels
implement (`ops.moe_forward`, `ops.moe_backward`, paper §3.3.1 / §3.3.2), so a kernel
replaces the inside of the rule and nothing a user sees changes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kosmos_jax import _compat, ops
from kosmos_jax.moe.config import MoEConfig

_PARAMS = ("router_w", "w1", "w2", "shared_w1", "shared_w2", "expert_bias")


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _moe(x, router_w, w1, w2, shared_w1, shared_w2, bias, config, axis_name, impl):
  y, aux, _ = ops.moe_forward(x, router_w, w1, w2, shared_w1, shared_w2, bias,
                              config=config, axis_name=axis_name, impl=impl)
  return y, aux


def _moe_fwd(x, router_w, w1, w2, shared_w1, shared_w2, bias, config, axis_name, impl):
  y, aux, res = ops.moe_forward(x, router_w, w1, w2, shared_w1, shared_w2, bias,
                                config=config, axis_name=axis_name, impl=impl)
  return (y, aux), (res, router_w, w1, w2, shared_w1, shared_w2, bias)


def _moe_bwd(config, axis_name, impl, saved, cts):
  res, router_w, w1, w2, shared_w1, shared_w2, bias = saved
  dy, daux = cts
  primals = (res.x, router_w, w1, w2, shared_w1, shared_w2)
  dy = _compat.pvary_to(dy, _compat.vma(res.x))
  grads = ops.moe_backward(res, dy, daux, router_w, w1, w2, shared_w1, shared_w2,
                           config=config, axis_name=axis_name, impl=impl)
  # Replicated weights (router, shared expert) got per-rank partial gradients: sum them.
  grads = tuple(None if g is None else _compat.reduce_to_vma(g, _compat.vma(p))
                for g, p in zip(grads, primals))
  # The expert bias steers selection only; it has no gradient (DeepSeek-V3 updates it
  # from the load, outside the optimizer).
  dbias = None if bias is None else jnp.zeros_like(bias)
  return (*grads, dbias)


_moe.defvjp(_moe_fwd, _moe_bwd)


def moe_layer(x, params: dict, config: MoEConfig, axis_name, *, impl=None):
  """Expert-parallel MoE layer, per device: call inside jax.shard_map over `axis_name`.

  Args:
    x: [..., t_local, hidden] this rank's tokens (sequence-sharded like SP
      activations); leading dims are flattened into tokens.
    params: dict with 'router_w' [hidden, E] (replicated), 'w1' [E_local, hidden, 2I]
      (gate|up), 'w2' [E_local, I, hidden] (this rank's experts: rank r owns experts
      r*E_local .. (r+1)*E_local-1), optional 'shared_w1' [hidden, 2I_s] and
      'shared_w2' [I_s, hidden] (replicated), optional 'expert_bias' [E] fp32.
    config: the MoEConfig.
    axis_name: the EP mesh axis.
    impl: None (KOSMOS_IMPL), 'auto', 'reference' or 'fused'.
  Returns:
    (y [..., t_local, hidden] in x.dtype, aux_loss [] fp32 over the EP group's tokens).
  """
  unknown = set(params) - set(_PARAMS)
  if unknown:
    raise ValueError(f"moe_layer: unknown params {sorted(unknown)}; expected a subset of {_PARAMS}")
  for name in ("router_w", "w1", "w2"):
    if name not in params:
      raise ValueError(f"moe_layer: params is missing {name!r} (got {sorted(params)})")
  if x.ndim < 2 or x.shape[-1] != config.hidden:
    raise ValueError(f"moe_layer: x.shape={tuple(x.shape)} must be [..., tokens, "
                     f"hidden={config.hidden}]")
  lead = x.shape[:-1]
  bias = params.get("expert_bias")
  if bias is not None:
    bias = jax.lax.stop_gradient(bias)
  y, aux = _moe(x.reshape(-1, x.shape[-1]), params["router_w"], params["w1"], params["w2"],
                params.get("shared_w1"), params.get("shared_w2"), bias, config, axis_name, impl)
  return y.reshape(*lead, y.shape[-1]), aux
