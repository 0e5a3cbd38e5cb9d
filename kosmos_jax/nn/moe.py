"""Flax NNX expert-parallel MoE over `kosmos_jax.moe.moe_layer` (no math here:
casting, params, sharding), and its Linen adapter.

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
from flax import nnx
from flax.nnx import bridge
from jax.sharding import PartitionSpec as P

from kosmos_jax.moe import MoEConfig, moe_layer
from kosmos_jax.nn import _spmd

Dtype = Any
# Fan-in is the hidden (resp. intermediate) axis; the leading expert axis is a batch axis.
default_expert_init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
default_kernel_init = nnx.initializers.lecun_normal()


class ExpertBias(nnx.Variable):
  """Selection-only routing bias (DeepSeek-V3): not a gradient parameter; the training
  loop updates it from the expert load, so optimizers over nnx.Param skip it."""


class MoE(nnx.Module):
  """Expert-parallel MoE layer: router, top-k, routed SwiGLU experts, optional shared expert."""

  def __init__(self, config: MoEConfig, *, mesh: jax.sharding.Mesh, ep_axis: str = "ep",
               dp_axis: str | None = None, dtype: Dtype | None = None,
               param_dtype: Dtype = jnp.float32, expert_init=default_expert_init,
               kernel_init=default_kernel_init, impl: str | None = None, rngs: nnx.Rngs):
    if not isinstance(config, MoEConfig):
      raise TypeError(f"MoE: config must be a MoEConfig, got {type(config).__name__}")
    _spmd.check_axes(mesh, ep_axis=ep_axis, dp_axis=dp_axis)
    ep = mesh.shape[ep_axis]
    if config.num_experts % ep:
      raise ValueError(f"MoE: num_experts={config.num_experts} must be divisible by the "
                       f"'{ep_axis}' axis size ep={ep}")
    self.config, self.mesh, self.ep_axis, self.dp_axis = config, mesh, ep_axis, dp_axis
    self.dtype, self.param_dtype, self.impl = dtype, param_dtype, impl
    e, h, i, si = (config.num_experts, config.hidden, config.expert_intermediate,
                   config.shared_expert_intermediate)

    def param(init, shape, axes):
      return nnx.Param(nnx.with_partitioning(init, axes, mesh=mesh)(rngs.params(), shape, param_dtype))

    self.router_w = param(kernel_init, (h, e), (None, None))                      # [h, E]
    self.w1 = param(expert_init, (e, h, 2 * i), (ep_axis, None, None))           # [E, h, 2I] gate|up
    self.w2 = param(expert_init, (e, i, h), (ep_axis, None, None))               # [E, I, h]
    self.shared_w1 = param(kernel_init, (h, 2 * si), (None, None)) if si else None
    self.shared_w2 = param(kernel_init, (si, h), (None, None)) if si else None
    self.expert_bias = ExpertBias(nnx.with_partitioning(
        nnx.initializers.zeros_init(), (None,), mesh=mesh)(rngs.params(), (e,), jnp.float32)
    ) if config.use_expert_bias else None

  def __call__(self, x):
    """x: [batch, seq, hidden] sequence-sharded over ep_axis -> (y like x, aux_loss [])."""
    cfg, ep, dp = self.config, self.ep_axis, self.dp_axis
    _spmd.check_act(type(self).__name__, x, mesh=self.mesh, features=cfg.hidden,
                    dp_axis=dp, seq_axis=ep)
    dt = jnp.dtype(self.dtype) if self.dtype is not None else jnp.result_type(x.dtype, self.param_dtype)
    names = ["router_w", "w1", "w2"]
    specs = [_spmd.act_spec(x.ndim, dp, ep, None), P(), P(ep), P(ep)]
    if self.shared_w1 is not None:
      names += ["shared_w1", "shared_w2"]
      specs += [P(), P()]
    args = [x.astype(dt)] + [getattr(self, n)[...].astype(dt) for n in names]
    if self.expert_bias is not None:
      names.append("expert_bias")
      specs.append(P())
      args.append(self.expert_bias[...])

    def local(x, *params):
      y, aux = moe_layer(x, dict(zip(names, params)), cfg, ep, impl=self.impl)
      return y, (jax.lax.pmean(aux, dp) if dp is not None else aux)

    return _spmd.run_sharded(local, self.mesh, args, specs, (specs[0], P()))


def MoELinen(*args, **kwargs):
  """`MoE(*args, **kwargs)` as a Linen module (flax.nnx.bridge.to_linen)."""
  return bridge.to_linen(MoE, *args, **kwargs)
