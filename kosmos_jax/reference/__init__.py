"""Pure-JAX twins of every kosmos op: the CPU path and the oracle of every kernel test.
`reference.<op>` has the signature of `ops.<op>` minus the dispatch knobs."""
from kosmos_jax.reference.matmul import matmul
from kosmos_jax.reference.moe import moe_backward, moe_forward
from kosmos_jax.reference.tp import ag_nn, ag_tn, bulk_ag_nn, bulk_rs_nt, tn_rs

__all__ = ["matmul", "ag_tn", "tn_rs", "ag_nn", "bulk_ag_nn", "bulk_rs_nt", "moe_forward", "moe_backward"]
