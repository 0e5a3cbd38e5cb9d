"""Flax NNX expert-parallel MoE over `kosmos_jax.moe.moe_layer` (no math here:
casting, params, sharding, recording the routing statistics).

Called on global [batch, seq, hidden] activations, sequence-sharded over the EP axis
(P(dp, ep, None), as SP activations are); returns (y, aux_loss) with y sharded alike
and aux_loss a replicated fp32 scalar (mean over dp replicas) to add to the loss.
Routed experts are split evenly over `ep_axis`: rank r holds experts
r*E/ep .. (r+1)*E/ep - 1. Router and shared expert are replicated.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import errors, nnx
from flax.nnx.nn import dtypes
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kosmos_jax.moe import MoEConfig, RoutingStats, moe_layer, reduce_stats
from kosmos_jax.nn import _spmd
from kosmos_jax.nn.mlp import gate_up_init
from kosmos_jax.kernel_config import MoeLaunch
from kosmos_jax.ops.moe import check_launch
from kosmos_jax.ops.tp import check_cap

Dtype = Any
# Fan-in is the hidden (resp. intermediate) axis; the leading expert axis is a batch axis.
default_expert_init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
default_kernel_init = nnx.initializers.lecun_normal()


class ExpertBias(nnx.Variable):
  """Selection-only routing bias (DeepSeek-V3): not a gradient parameter; the training
  loop updates it from the expert load, so optimizers over nnx.Param skip it."""


class RoutingStat(nnx.Variable):
  """A routing statistic of the latest call (as nnx.BatchStat is for BatchNorm):
  written by every call, never differentiated, skipped by optimizers over nnx.Param.
  Read them with `nnx.state(model, RoutingStat)` or as attributes of the module."""


class MoE(nnx.Module):
  """Expert-parallel MoE layer: router, top-k, routed SwiGLU experts, optional shared expert.

  Params (nnx.Param): `router_w` [hidden, E]; `gate_up` [E, hidden, 2, I] (index 0
  gate, 1 up, as ParallelMLP's `gate_up`) and `down` [E, I, hidden], sharded over
  `ep_axis` on E; with a shared expert `shared_gate_up` [hidden, 2, I_s] and
  `shared_down` [I_s, hidden]. `expert_bias` [E] is an ExpertBias, not a Param.
  `expert_init` / `kernel_init` see each gate_up as the matrix [.., hidden, 2I].

  With record_stats=True (the default) each call records this step's routing
  statistics over the whole batch (all dp replicas) in RoutingStat variables:
  `expert_counts` [E] int32 (token, slot) pairs per expert, `max_load` [] (largest
  count / mean count), `capacity_fill` [] (most rows one (source rank, expert) sent /
  capacity; > 1 means the capped buffers overflowed) and `dropless_fallback` [] bool
  (so the dropless pass ran). Like BatchNorm's statistics they update under NNX
  transforms (nnx.jit, nnx.grad, ...); read them after the step. A call under a plain
  jax transform cannot write them: pass record_stats=False there.

  precision: jax.lax.Precision of every dot of the layer (None = JAX's default; the
  fused kernels accept only None). use_bias must stay False (no bias epilogue).
  cu_cap: at most this many SMs for the fused megakernels; launch: their other knobs
  (kernel_config.MoeLaunch: movers, role switching; `config` is the model's
  MoEConfig). The reference path checks both and ignores them. impl='fused' runs
  both directions fused (EP = 1 so far: an ep_axis of size 1; bf16; the backward
  with hidden % 128).
  """

  def __init__(self, config: MoEConfig, *, mesh: jax.sharding.Mesh, ep_axis: str = "ep",
               dp_axis: str | None = None, use_bias: bool = False, dtype: Dtype | None = None,
               param_dtype: Dtype = jnp.float32, precision=None, expert_init=default_expert_init,
               kernel_init=default_kernel_init, promote_dtype=dtypes.promote_dtype,
               record_stats: bool = True, impl: str | None = None, cu_cap: int | None = None,
               launch: MoeLaunch | None = None, rngs: nnx.Rngs):
    if not isinstance(config, MoEConfig):
      raise TypeError(f"MoE: config must be a MoEConfig, got {type(config).__name__}")
    _spmd.check_module("MoE", impl=impl, use_bias=use_bias)
    check_cap("MoE", cu_cap)
    check_launch("MoE", launch)
    _spmd.check_axes(mesh, ep_axis=ep_axis, dp_axis=dp_axis)
    ep = mesh.shape[ep_axis]
    if config.num_experts % ep:
      raise ValueError(f"MoE: num_experts={config.num_experts} must be divisible by the "
                       f"'{ep_axis}' axis size ep={ep}")
    self.config, self.mesh, self.ep_axis, self.dp_axis = config, mesh, ep_axis, dp_axis
    self.dtype, self.param_dtype, self.precision, self.impl = dtype, param_dtype, precision, impl
    self.promote_dtype, self.cu_cap, self.launch = promote_dtype, cu_cap, launch
    e, h, i, si = (config.num_experts, config.hidden, config.expert_intermediate,
                   config.shared_expert_intermediate)

    def param(init, shape, axes):
      return nnx.Param(nnx.with_partitioning(init, axes, mesh=mesh)(rngs.params(), shape, param_dtype))

    self.router_w = param(kernel_init, (h, e), (None, None))
    self.gate_up = param(gate_up_init(expert_init), (e, h, 2, i), (ep_axis, None, None, None))
    self.down = param(expert_init, (e, i, h), (ep_axis, None, None))
    self.shared_gate_up = param(gate_up_init(kernel_init), (h, 2, si), (None,) * 3) if si else None
    self.shared_down = param(kernel_init, (si, h), (None, None)) if si else None
    self.expert_bias = ExpertBias(nnx.with_partitioning(
        nnx.initializers.zeros_init(), (None,), mesh=mesh)(rngs.params(), (e,), jnp.float32)
    ) if config.use_expert_bias else None
    self.record_stats = bool(record_stats)
    if self.record_stats:
      replicated = NamedSharding(mesh, P())
      for name, value in zip(RoutingStats._fields, _no_stats(e)):
        setattr(self, name, RoutingStat(jax.device_put(value, replicated)))

  def __call__(self, x):
    """x: [batch, seq, hidden] sequence-sharded over ep_axis -> (y like x, aux_loss [])."""
    cfg, ep, dp = self.config, self.ep_axis, self.dp_axis
    _spmd.check_act(type(self).__name__, x, mesh=self.mesh, features=cfg.hidden,
                    dp_axis=dp, seq_axis=ep)
    names = [n for n in ("router_w", "gate_up", "down", "shared_gate_up", "shared_down")
             if getattr(self, n) is not None]
    x, *weights = self.promote_dtype((x, *(getattr(self, n)[...] for n in names)), dtype=self.dtype)
    specs = [_spmd.act_spec(x.ndim, dp, ep, None)] + [P(ep) if n in ("gate_up", "down") else P()
                                                      for n in names]
    args = [x, *weights]
    if self.expert_bias is not None:  # fp32 whatever the compute dtype: it only ranks scores
      names.append("expert_bias")
      specs.append(P())
      args.append(self.expert_bias[...])

    def local(x, *params):
      y, aux, stats = moe_layer(x, dict(zip(names, params)), cfg, axis_name=ep, impl=self.impl,
                                precision=self.precision, cu_cap=self.cu_cap, launch=self.launch,
                                return_stats=True)
      if dp is not None:
        aux, stats = jax.lax.pmean(aux, dp), reduce_stats(stats, dp)
      return (y, aux, stats) if self.record_stats else (y, aux)

    out_specs = (specs[0], P()) + ((RoutingStats(*(P(),) * len(RoutingStats._fields)),)
                                   if self.record_stats else ())
    y, aux, *stats = _spmd.run_sharded(local, self.mesh, args, specs, out_specs)
    if self.record_stats:
      self._record(stats[0])
    return y, aux

  def _record(self, stats: RoutingStats) -> None:
    try:
      for name, value in zip(RoutingStats._fields, stats):
        getattr(self, name)[...] = value
    except errors.TraceContextError as e:
      raise errors.TraceContextError(
          f"MoE records its routing statistics in RoutingStat variables, which only an NNX "
          f"transform around the call (nnx.jit, nnx.grad, nnx.scan, ...) can update, as for "
          f"BatchNorm; under a plain jax transform construct it with record_stats=False "
          f"({e})") from None


def _no_stats(num_experts: int) -> RoutingStats:
  """The statistics before any call: nothing routed."""
  return RoutingStats(jnp.zeros((num_experts,), jnp.int32), jnp.zeros((), jnp.float32),
                      jnp.zeros((), jnp.float32), jnp.zeros((), jnp.bool_))
