"""Per-device MoE layer ops (paper §3.3: one launch per direction), called inside
shard_map over the EP axis. Each validates its operands (errors name the values,
raised before lowering), then runs the fused megakernel or its reference twin
(`kosmos_jax.reference.moe_forward` / `moe_backward`), as `impl` / KOSMOS_IMPL decide.

Shapes (per device; ep = size of `axis_name`; E_l = num_experts / ep):
  x [t, hidden]; router_w [hidden, E] (replicated); gate_up [E_l, hidden, 2, I] (gate,
  then up, as `tp.parallel_swiglu_mlp`'s w_gate_up); down [E_l, I, hidden];
  shared_gate_up [hidden, 2, I_s], shared_down [I_s, hidden] (replicated, only when
  config.shared_expert_intermediate > 0); bias [E] (only with use_expert_bias).

  moe_forward  -> (y [t, hidden], aux loss [], residuals) (for_backward=False: residuals
                  for routing_stats only, which moe_backward refuses)
  moe_backward -> (dx, drouter_w, dgate_up, ddown, dshared_gate_up, dshared_down)

`precision` (a jax.lax.Precision, or None for JAX's default) reaches every dot of the
reference twin; the fused kernels have one precision of their own, so they refuse any
other value rather than ignore it. `cu_cap` (at most that many SMs) and `launch`
(kernel_config.MoeLaunch: the movers and role switching; `config` is already the
layer's MoEConfig) are for the fused megakernel; the reference twin checks them and
ignores them, as every op's reference path does.

Fused paths so far: moe_forward at EP 1 to 8 (an `axis_name` of one host's GPUs), bf16,
with the router in XLA before the one launch, which runs the shared expert too (as wide as a
routed expert; kosmos_jax/ops/_fused_moe.py); moe_backward at the same EP sizes after a
fused forward (it reads the forward's workspace, residuals.ws), the shared expert's
gradients in its one launch, the routing-weight and router gradients in XLA beside it
(kosmos_jax/ops/_fused_moe_bwd.py). At EP > 1 both run only as loopback ranks on one GPU
so far (never across GPUs).
Under `auto` (the default) the forward runs fused where it was measured faster than
the twin: EP = 1, bf16, Hopper builders (compute capability 9.0), precision None, and
at least 128 routed pairs per expert on average (tokens x top_k >= 128 x num_experts);
the backward runs fused after a fused forward. Elsewhere `auto` runs the twins
(ops.auto_note(op, call) says why).
The fused moe_forward is not differentiable by itself: differentiate the layer
(kosmos_jax.moe.moe_layer), whose custom_vjp pairs the ops.
"""
from __future__ import annotations

from kosmos_jax import reference
from kosmos_jax.ops import _checks as chk
from kosmos_jax.ops._dispatch import choose, fused
from kosmos_jax.kernel_config import MoeLaunch
from kosmos_jax.ops.tp import check_cap
from kosmos_jax.reference.moe_config import MoEConfig


def _shape(op: str, name: str, a, want: tuple) -> None:
  if tuple(a.shape) != tuple(want):
    raise ValueError(f"{op}: {name}.shape={tuple(a.shape)} must be {tuple(want)}")


def check_operands(op: str, x, router_w, gate_up, down, shared_gate_up, shared_down, bias, config,
                   ep: int, *, check_bias: bool = True):
  """All shape / dtype / config checks shared by both directions."""
  if not isinstance(config, MoEConfig):
    raise TypeError(f"{op}: config must be a MoEConfig, got {type(config).__name__}")
  e, h, i = config.num_experts, config.hidden, config.expert_intermediate
  if e % ep:
    raise ValueError(f"{op}: num_experts={e} must be divisible by the EP size ep={ep}")
  chk.rank2(op, "x", x)
  if x.shape[1] != h:
    raise ValueError(f"{op}: x.shape[-1]={x.shape[1]} must equal config.hidden={h}")
  if x.shape[0] < 1:
    raise ValueError(f"{op}: x.shape={tuple(x.shape)} has no tokens")
  _shape(op, "router_w", router_w, (h, e))
  _shape(op, "gate_up", gate_up, (e // ep, h, 2, i))
  _shape(op, "down", down, (e // ep, i, h))
  si = config.shared_expert_intermediate
  if si and (shared_gate_up is None or shared_down is None):
    raise ValueError(f"{op}: config.shared_expert_intermediate={si} needs shared_gate_up and "
                     "shared_down")
  if not si and (shared_gate_up is not None or shared_down is not None):
    raise ValueError(f"{op}: shared expert weights given but config.shared_expert_intermediate=0")
  arrays = dict(x=x, router_w=router_w, gate_up=gate_up, down=down)
  if si:
    _shape(op, "shared_gate_up", shared_gate_up, (h, 2, si))
    _shape(op, "shared_down", shared_down, (si, h))
    arrays.update(shared_gate_up=shared_gate_up, shared_down=shared_down)
  chk.dtypes(op, **arrays)
  if config.use_expert_bias and check_bias:
    if bias is None:
      raise ValueError(f"{op}: config.use_expert_bias=True needs bias of shape ({e},), got None")
    _shape(op, "bias", bias, (e,))


def check_launch(op: str, launch) -> MoeLaunch:
  """`launch` as a MoeLaunch (None: the defaults); TypeError for any other type."""
  if launch is None:
    return MoeLaunch()
  if type(launch) is not MoeLaunch:
    raise TypeError(f"{op}: launch={launch!r} must be of type MoeLaunch (or None); `config` is the "
                    "layer's MoEConfig, the fused kernel's knobs go in launch=")
  return launch


def _run(op: str, impl, precision, cu_cap, args: tuple, kwargs: dict, fused_kwargs: dict | None = None):
  check_cap(op, cu_cap)
  if choose(op, impl, (args, dict(kwargs, precision=precision))) == "fused":
    if precision is not None:
      raise ValueError(f"{op}: precision={precision!r} cannot be honoured by the fused kernel "
                       "(it has one precision of its own); pass precision=None, or "
                       "impl='reference' for the twin at that precision")
    return fused(op)(*args, **kwargs, **(fused_kwargs or {}), cu_cap=cu_cap)
  return getattr(reference, op)(*args, **kwargs, precision=precision)


def moe_forward(x, router_w, gate_up, down, shared_gate_up=None, shared_down=None, bias=None, *,
                config: MoEConfig, axis_name, impl=None, precision=None, cu_cap=None,
                launch: MoeLaunch | None = None, for_backward: bool = True):
  """Whole MoE layer forward: route, plan, dispatch, GEMM1+SwiGLU, GEMM2, combine,
  fold (+ shared expert). Returns (y, aux_loss, residuals). launch: MoeLaunch
  knobs of the fused kernel (None: its defaults). for_backward=False: no
  moe_backward will read these residuals (inference; moe_layer outside a
  gradient): the fused kernel then keeps no pre-activations, and on either path
  the residuals come back with x, routing and layout only (what routing_stats
  reads; xr, h1, rows, hs and ws None), which moe_backward refuses."""
  op = "moe_forward"
  if not isinstance(for_backward, bool):
    raise TypeError(f"{op}: for_backward={for_backward!r} must be a bool")
  ep = chk.axis_size(op, axis_name)
  check_operands(op, x, router_w, gate_up, down, shared_gate_up, shared_down, bias, config, ep)
  launch = check_launch(op, launch)
  bias = bias if config.use_expert_bias else None
  args = (x, router_w, gate_up, down, shared_gate_up, shared_down, bias)
  y, aux, res = _run(op, impl, precision, cu_cap, args, dict(config=config, axis_name=axis_name),
                     dict(launch=launch, for_backward=for_backward))
  return y, aux, res if for_backward else trimmed(res)


def trimmed(res):
  """Residuals no backward reads (moe_forward(for_backward=False)): x, routing and
  layout kept, the rest dropped."""
  return res._replace(xr=None, h1=None, rows=None, hs=None, ws=None)


def refuse_trimmed(op: str, residuals, config: MoEConfig) -> None:
  """ValueError for residuals that lack what the backward reads: the expert outputs
  (output gating) or the shared expert's pre-activations (moe_forward(for_backward=False)
  drops both; with input gating and no shared expert the twin recomputes everything)."""
  missing = [name for name, needed in (("rows", config.gating == "output"),
                                       ("hs", bool(config.shared_expert_intermediate)))
             if needed and getattr(residuals, name) is None]
  if missing:
    raise ValueError(f"{op}: residuals.{' and residuals.'.join(missing)} is None, which this config's "
                     f"backward reads (gating={config.gating!r}, shared_expert_intermediate="
                     f"{config.shared_expert_intermediate}): residuals of moe_forward(for_backward=False) "
                     "serve routing_stats only; run the forward with for_backward=True for a backward")


def moe_backward(residuals, dy, daux, router_w, gate_up, down, shared_gate_up=None,
                 shared_down=None, *, config: MoEConfig, axis_name, impl=None, precision=None, cu_cap=None):
  """Whole MoE layer backward from moe_forward's residuals and the cotangents of
  (y, aux_loss). Returns (dx, drouter_w, dgate_up, ddown, dshared_gate_up, dshared_down)."""
  op = "moe_backward"
  ep = chk.axis_size(op, axis_name)
  x = residuals.x
  # The bias only steers selection, which the residuals already hold.
  check_operands(op, x, router_w, gate_up, down, shared_gate_up, shared_down, None, config, ep,
                 check_bias=False)
  if tuple(dy.shape) != tuple(x.shape):
    raise ValueError(f"{op}: dy.shape={tuple(dy.shape)} must equal x.shape={tuple(x.shape)}")
  refuse_trimmed(op, residuals, config)
  args = (residuals, dy.astype(x.dtype), daux, router_w, gate_up, down, shared_gate_up, shared_down)
  return _run(op, impl, precision, cu_cap, args, dict(config=config, axis_name=axis_name))
