"""Per-device ops, called inside jax.shard_map; each picks its fused FFI kernel or its
reference twin (KOSMOS_IMPL=auto|reference|fused, or `impl=` per call)."""
from kosmos_jax.ops._dispatch import auto_note, choose, default_impl, fused_status
from kosmos_jax.ops import _fused_tp  # noqa: F401  (registers the fused kernels)
from kosmos_jax.ops import _fused_gemm  # noqa: F401  (registers the fused matmul)
from kosmos_jax.ops import _fused_bulk_rs  # noqa: F401  (registers the fused bulk RS || NT)
from kosmos_jax.ops import _fused_moe  # noqa: F401  (registers the fused MoE forward, EP = 1)
from kosmos_jax.ops import _fused_moe_bwd  # noqa: F401  (registers the fused MoE backward, EP = 1)
from kosmos_jax.ops.matmul import matmul
from kosmos_jax.ops.moe import moe_backward, moe_forward
from kosmos_jax.ops.tp import ag_nn, ag_tn, bulk_ag_nn, bulk_rs_nt, tn_rs

__all__ = ["ag_tn", "tn_rs", "ag_nn", "bulk_ag_nn", "bulk_rs_nt", "matmul",
           "default_impl", "fused_status", "choose", "auto_note", "moe_forward", "moe_backward"]
