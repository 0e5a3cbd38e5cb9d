"""kosmos_jax: self-scheduling persistent kernels fusing TP+SP and EP communication
into GEMMs, for JAX (see README.md). Public API only.

  kosmos_jax.ops            per-device ops (fused FFI kernel or reference twin)
  kosmos_jax.reference      the pure-JAX twins of every op
  kosmos_jax.tp             TP+SP linears with custom_vjp (inside shard_map)
  kosmos_jax.moe            expert-parallel MoE layer (inside shard_map)
  kosmos_jax.nn             Flax NNX modules (+ Linen adapters)
  kosmos_jax.kernel_config  the fused kernels' knobs: AgConfig, RsConfig, MoeLaunch (also here)
  kosmos_jax.runtime        symmetric heap setup, device queries
  kosmos_jax.trace          per-CTA role timelines of the kernels
"""
# Every submodule loads here, in dependency order (none of them imports this
# package's namespace, so there is no cycle); flax is a dependency, so nn loads too.
from kosmos_jax import kernel_config, ops, reference, runtime, tp, trace
from kosmos_jax import moe, nn
from kosmos_jax._ext import available
from kosmos_jax.kernel_config import AgConfig, MoeLaunch, RsConfig

__version__ = "0.1.0"

__all__ = ["ops", "reference", "tp", "moe", "nn", "kernel_config", "runtime", "trace", "AgConfig",
           "RsConfig", "MoeLaunch", "available", "__version__"]
