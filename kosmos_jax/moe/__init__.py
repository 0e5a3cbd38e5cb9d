"""Expert-parallel MoE layer (paper §3.3): config and presets, router, the functional
layer with its custom_vjp, and the plan/dispatch/combine/fold building blocks (which
live with the reference twin, `kosmos_jax.reference.moe`)."""
from kosmos_jax.moe.config import (DEEPSEEK_V3, LLAMA4_MAVERICK, LLAMA4_SCOUT, PRESETS,
                                   QWEN3_30B_A3B, QWEN3_235B_A22B, MoEConfig)
from kosmos_jax.moe.router import Routing, aux_loss, route
from kosmos_jax.moe.layer import moe_layer

_FROM_REFERENCE = ("plan", "dispatch", "combine", "fold", "Layout", "MoEResiduals")


def __getattr__(name):
  # Resolved lazily: kosmos_jax.reference.moe itself imports kosmos_jax.moe.router.
  if name in _FROM_REFERENCE:
    from kosmos_jax.reference import moe as _ref
    return getattr(_ref, name)
  raise AttributeError(f"module 'kosmos_jax.moe' has no attribute {name!r}")


__all__ = ["MoEConfig", "PRESETS", "DEEPSEEK_V3", "QWEN3_235B_A22B", "QWEN3_30B_A3B",
           "LLAMA4_SCOUT", "LLAMA4_MAVERICK", "route", "Routing", "aux_loss", "moe_layer",
           *_FROM_REFERENCE]
