"""Functional expert-parallel MoE layer with a custom_vjp over the whole layer.

The rule's forward / backward are exactly the two per-device ops the megakernels
implement (`ops.moe_forward`, `ops.moe_backward`, paper §3.3.1 / §3.3.2), so a kernel
replaces the inside of the rule and nothing a user sees changes.

Under impl='fused' (or KOSMOS_IMPL=fused) the forward runs its kernel and the backward
its own on the fused forward's residuals: both directions fused, at EP = 1 and over an
EP group of one host's GPUs. Where ops.moe_backward has no fused kernel at all (an
extension without it, no usable GPU), the twin's backward runs on those residuals
instead.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kosmos_jax import _compat, ops
from kosmos_jax.kernel_config import MoeLaunch
from kosmos_jax.ops.moe import check_launch
from kosmos_jax.reference.moe import RoutingStats, routing_stats
from kosmos_jax.reference.moe_config import MoEConfig

_PARAMS = ("router_w", "gate_up", "down", "shared_gate_up", "shared_down", "expert_bias")
_RENAMED = {"w1": "gate_up", "w2": "down", "shared_w1": "shared_gate_up", "shared_w2": "shared_down"}


def _forward(x, router_w, gate_up, down, shared_gate_up, shared_down, bias, config, axis_name, impl,
             precision, cu_cap, launch, for_backward):
  y, aux, res = ops.moe_forward(x, router_w, gate_up, down, shared_gate_up, shared_down, bias,
                                config=config, axis_name=axis_name, impl=impl, precision=precision,
                                cu_cap=cu_cap, launch=launch, for_backward=for_backward)
  return (y, aux, routing_stats(res, config, axis_name)), res


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10, 11, 12))
def _moe(x, router_w, gate_up, down, shared_gate_up, shared_down, bias, config, axis_name, impl,
         precision, cu_cap, launch):
  # Outside a gradient (the primal alone): nothing reads residuals, so the fused
  # kernel keeps no pre-activations.
  return _forward(x, router_w, gate_up, down, shared_gate_up, shared_down, bias, config, axis_name,
                  impl, precision, cu_cap, launch, for_backward=False)[0]


def _moe_fwd(x, router_w, gate_up, down, shared_gate_up, shared_down, bias, config, axis_name, impl,
             precision, cu_cap, launch):
  out, res = _forward(x, router_w, gate_up, down, shared_gate_up, shared_down, bias, config,
                      axis_name, impl, precision, cu_cap, launch, for_backward=True)
  return out, (res, router_w, gate_up, down, shared_gate_up, shared_down, bias)


def _backward_impl(impl):
  """The backward's path: `impl`, except that where ops.moe_backward's fused kernel
  cannot run at all (not compiled, no usable GPU) a fused forward is paired with the
  twin's backward (which reads the fused forward's residuals), rather than a backward
  that raises."""
  return impl if ops.fused_status("moe_backward")[0] else "reference"


def _moe_bwd(config, axis_name, impl, precision, cu_cap, launch, saved, cts):
  res, router_w, gate_up, down, shared_gate_up, shared_down, bias = saved
  dy, daux, _ = cts  # the routing statistics are counts: nothing flows back through them
  primals = (res.x, router_w, gate_up, down, shared_gate_up, shared_down)
  dy = _compat.pvary_to(dy, _compat.vma(res.x))
  grads = ops.moe_backward(res, dy, daux, router_w, gate_up, down, shared_gate_up, shared_down,
                           config=config, axis_name=axis_name, impl=_backward_impl(impl),
                           precision=precision, cu_cap=cu_cap)
  # Replicated weights (router, shared expert) got per-rank partial gradients: sum them.
  grads = tuple(None if g is None else _compat.reduce_to_vma(g, _compat.vma(p))
                for g, p in zip(grads, primals))
  # The expert bias steers selection only; it has no gradient (DeepSeek-V3 updates it
  # from the load, outside the optimizer).
  dbias = None if bias is None else jnp.zeros_like(bias)
  return (*grads, dbias)


_moe.defvjp(_moe_fwd, _moe_bwd)


def _check_params(params: dict) -> None:
  unknown = set(params) - set(_PARAMS)
  if unknown:
    hint = "; ".join(f"{old!r} is now {new!r}" for old, new in _RENAMED.items() if old in unknown)
    raise ValueError(f"moe_layer: unknown params {sorted(unknown)}; expected a subset of "
                     f"{_PARAMS}" + (f" ({hint}, gate_up as [E_local, hidden, 2, I])" if hint else ""))
  for name in ("router_w", "gate_up", "down"):
    if name not in params:
      raise ValueError(f"moe_layer: params is missing {name!r} (got {sorted(params)})")


def moe_layer(x, params: dict, config: MoEConfig, *, axis_name, impl=None, precision=None,
              cu_cap=None, launch: MoeLaunch | None = None, return_stats: bool = False):
  """Expert-parallel MoE layer, per device: call inside jax.shard_map over `axis_name`.

  Args:
    x: [..., t_local, hidden] this rank's tokens (sequence-sharded like SP
      activations); leading dims are flattened into tokens.
    params: dict with 'router_w' [hidden, E] (replicated), 'gate_up'
      [E_local, hidden, 2, I] (gate, then up), 'down' [E_local, I, hidden] (this rank's
      experts: rank r owns experts r*E_local .. (r+1)*E_local-1), optional
      'shared_gate_up' [hidden, 2, I_s] and 'shared_down' [I_s, hidden] (replicated),
      optional 'expert_bias' [E] fp32.
    config: the MoEConfig.
    axis_name: the EP mesh axis.
    impl: None (KOSMOS_IMPL), 'auto', 'reference' or 'fused'.
    precision: jax.lax.Precision of every dot (None = JAX's default); the fused
      kernels accept only None.
    cu_cap: at most this many SMs for the fused megakernels (the reference path
      checks it and ignores it).
    launch: kernel_config.MoeLaunch, the fused forward's movers and role switching
      (None: its defaults; the reference path checks its type and ignores it).
    return_stats: also return this step's `RoutingStats` (per-expert counts, max
      load, capacity fill, whether the dropless fallback ran), over the EP group.
  Returns:
    (y [..., t_local, hidden] in x.dtype, aux_loss [] fp32 over the EP group's tokens),
    plus the RoutingStats when return_stats=True.
  """
  _check_params(params)
  launch = check_launch("moe_layer", launch)  # before the custom_vjp, which keeps it as a static
  if x.ndim < 2 or x.shape[-1] != config.hidden:
    raise ValueError(f"moe_layer: x.shape={tuple(x.shape)} must be [..., tokens, "
                     f"hidden={config.hidden}]")
  lead = x.shape[:-1]
  bias = params.get("expert_bias")
  if bias is not None:
    bias = jax.lax.stop_gradient(bias)
  y, aux, stats = _moe(x.reshape(-1, x.shape[-1]), params["router_w"], params["gate_up"],
                       params["down"], params.get("shared_gate_up"), params.get("shared_down"),
                       bias, config, axis_name, impl, precision, cu_cap, launch)
  y = y.reshape(*lead, y.shape[-1])
  # Counts and their ratios: no gradient (and none wanted through a later pmax of them).
  stats = jax.tree.map(jax.lax.stop_gradient, stats)
  return (y, aux, stats) if return_stats else (y, aux)


__all__ = ["moe_layer", "RoutingStats"]
