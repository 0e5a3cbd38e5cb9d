"""Linen adapters for users still on Flax Linen: each kosmos NNX module as a Linen
module through `flax.nnx.bridge.to_linen` (params keep their partitioning). All of
them live here.

Collections: params in 'params'; MoE's selection bias in 'ExpertBias' (required when
config.use_expert_bias: an apply without it raises instead of routing with a zero
bias); MoE's routing statistics in 'RoutingStat' (written when the apply makes that
collection mutable, `layer.apply(v, x, mutable=['RoutingStat'])`).
"""
from __future__ import annotations

from flax import linen
from flax.core import FrozenDict
from flax.nnx import bridge

from kosmos_jax.nn.linear import ColumnParallelLinear, RowParallelLinear
from kosmos_jax.nn.mlp import ParallelMLP
from kosmos_jax.nn.moe import MoE

BIAS_COLLECTION = "ExpertBias"


def to_linen(nnx_class, *args, **kwargs):
  """`nnx_class(*args, **kwargs)` as a Linen module; call `.init` / `.apply` as usual."""
  return bridge.to_linen(nnx_class, *args, **kwargs)


def ColumnParallelLinearLinen(*args, **kwargs):
  return to_linen(ColumnParallelLinear, *args, **kwargs)


def RowParallelLinearLinen(*args, **kwargs):
  return to_linen(RowParallelLinear, *args, **kwargs)


def ParallelMLPLinen(*args, **kwargs):
  return to_linen(ParallelMLP, *args, **kwargs)


class _MoEToLinen(bridge.ToLinen):
  """bridge.ToLinen over MoE that refuses an apply without the expert bias: the
  bridge would otherwise build the module afresh and route with its zero bias."""

  @linen.compact
  def __call__(self, *args, **kwargs):
    config = self.kwargs.get("config", self.args[0] if self.args else None)
    if (getattr(config, "use_expert_bias", False) and not self.is_initializing()
        and not self.has_variable(BIAS_COLLECTION, "expert_bias")):
      raise ValueError(
          f"MoELinen: config.use_expert_bias=True but the variables have no "
          f"'{BIAS_COLLECTION}' collection (got {sorted(self.variables)}); pass every "
          f"collection init returned, e.g. layer.apply(variables, x), not only 'params'")
    return super().__call__(*args, **kwargs)


def MoELinen(*args, **kwargs):
  """`MoE(*args, **kwargs)` as a Linen module (see the module doc for its collections)."""
  return _MoEToLinen(MoE, args=args, kwargs=FrozenDict(kwargs))
