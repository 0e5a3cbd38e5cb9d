"""Linen adapters for users still on Flax Linen: each kosmos NNX module as a Linen
module through `flax.nnx.bridge.to_linen` (params keep their partitioning)."""
from __future__ import annotations

from flax.nnx import bridge

from kosmos_jax.nn.linear import ColumnParallelLinear, RowParallelLinear
from kosmos_jax.nn.mlp import ParallelMLP


def to_linen(nnx_class, *args, **kwargs):
  """`nnx_class(*args, **kwargs)` as a Linen module; call `.init` / `.apply` as usual."""
  return bridge.to_linen(nnx_class, *args, **kwargs)


def ColumnParallelLinearLinen(*args, **kwargs):
  return to_linen(ColumnParallelLinear, *args, **kwargs)


def RowParallelLinearLinen(*args, **kwargs):
  return to_linen(RowParallelLinear, *args, **kwargs)


def ParallelMLPLinen(*args, **kwargs):
  return to_linen(ParallelMLP, *args, **kwargs)
