"""Flax modules over the kosmos functional layers (NNX, plus Linen adapters)."""
from kosmos_jax.nn.linear import ColumnParallelLinear, RowParallelLinear
from kosmos_jax.nn.linen import (ColumnParallelLinearLinen, MoELinen, ParallelMLPLinen,
                                 RowParallelLinearLinen, to_linen)
from kosmos_jax.nn.mlp import ParallelMLP
from kosmos_jax.nn.moe import ExpertBias, MoE, RoutingStat

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "to_linen",
           "ColumnParallelLinearLinen", "RowParallelLinearLinen", "ParallelMLPLinen",
           "MoE", "MoELinen", "ExpertBias", "RoutingStat"]
