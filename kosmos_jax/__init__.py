"""kosmos_jax: self-scheduling persistent kernels fusing TP+SP and EP communication
into GEMMs, for JAX (see README.md). Public API only.

  kosmos_jax.ops        per-device ops (fused FFI kernel or reference twin)
  kosmos_jax.reference  the pure-JAX twins of every op
  kosmos_jax.tp         TP+SP linears with custom_vjp (inside shard_map)
  kosmos_jax.moe        expert-parallel MoE layer (inside shard_map)
  kosmos_jax.nn         Flax NNX modules (+ Linen adapters)
"""
import importlib

from kosmos_jax import ops, reference, tp
from kosmos_jax._ext import available

__version__ = "0.1.0"
_LAZY = ("nn", "moe", "runtime", "config", "trace")


def __getattr__(name):
  # Flax-dependent and optional submodules load on first use.
  if name in _LAZY:
    return importlib.import_module(f"kosmos_jax.{name}")
  raise AttributeError(f"module 'kosmos_jax' has no attribute {name!r}")


__all__ = ["ops", "reference", "tp", "nn", "moe", "available", "__version__"]
