"""Expert-parallel MoE layer (paper §3.3): the functional layer with its custom_vjp
(`moe_layer`), plus, for users, the config and presets, the router and the
plan/dispatch/combine/fold building blocks, which live at the reference floor
(`kosmos_jax.reference.moe_config`, `.moe_router`, `.moe`) so that the ops and their
twins never import this package."""
from kosmos_jax.moe.layer import moe_layer
from kosmos_jax.reference.moe import (Layout, MoEResiduals, RoutingStats, combine, dispatch, fold,
                                      plan, reduce_stats)
from kosmos_jax.reference.moe_config import (DEEPSEEK_V3, LLAMA4_MAVERICK, LLAMA4_SCOUT, PRESETS,
                                             QWEN3_30B_A3B, QWEN3_235B_A22B, MoEConfig)
from kosmos_jax.reference.moe_router import Routing, aux_loss, route

__all__ = ["MoEConfig", "PRESETS", "DEEPSEEK_V3", "QWEN3_235B_A22B", "QWEN3_30B_A3B",
           "LLAMA4_SCOUT", "LLAMA4_MAVERICK", "route", "Routing", "aux_loss", "moe_layer",
           "RoutingStats", "reduce_stats", "plan", "dispatch", "combine", "fold", "Layout",
           "MoEResiduals"]
