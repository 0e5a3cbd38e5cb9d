"""Reference twins of the five TP+SP collective-GEMM ops (paper Table B.2, Figure 5).

Per-device functions, called inside `jax.shard_map` over the TP axis `axis_name`.
The gathered / scattered dimension is always the sequence (row) dimension just
before the features, axis -2; leading batch dims ride along. Every GEMM
accumulates in fp32 and reductions across ranks are summed in fp32 and rounded
once, which is what the fused kernels do (paper §3.2.2), so twin and kernel agree
to rounding.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kosmos_jax.reference.matmul import matmul

_SEQ = -2  # sequence axis: gathered and scattered


def _gather_rows(x, axis_name):
  return jax.lax.all_gather(x, axis_name, axis=x.ndim + _SEQ, tiled=True)


def _reduce_scatter_rows(partial_f32, axis_name, out_dtype):
  y = jax.lax.psum_scatter(partial_f32, axis_name, scatter_dimension=partial_f32.ndim + _SEQ,
                           tiled=True)
  return y.astype(out_dtype)


def ag_tn(x, w, *, axis_name, precision=None):
  """Column-parallel forward: x [..., m_local, k], w [k, n] -> AG(x) @ w [..., m_local*tp, n]."""
  return matmul(_gather_rows(x, axis_name), w, layout="TN", precision=precision)


def tn_rs(x, w, *, axis_name, precision=None):
  """Row-parallel forward: x [..., m, k], w [k, n] -> RS(x @ w) [..., m/tp, n]."""
  partial = jax.lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())), precision=precision,
                                preferred_element_type=jnp.float32)
  return _reduce_scatter_rows(partial, axis_name, x.dtype)


def ag_nn(dy, w, *, axis_name, return_gathered: bool = False, precision=None):
  """Row-parallel dgrad: dy [..., m_local, n], w [k, n] -> AG(dy) @ w.T [..., m, k]
  (and AG(dy) [..., m, n] when `return_gathered`, for the weight gradient)."""
  dy_g = _gather_rows(dy, axis_name)
  dx = matmul(dy_g, w, layout="NN", precision=precision)
  return (dx, dy_g) if return_gathered else dx


def bulk_ag_nn(x, dy, w, *, axis_name, precision=None):
  """Column-parallel dgrad beside the gather of x for wgrad (no data dependency):
  x [..., m_local, k], dy [..., m, n], w [k, n] ->
  (AG(x) [..., m, k], dy @ w.T [..., m, k], the per-rank partial of dx)."""
  return _gather_rows(x, axis_name), matmul(dy, w, layout="NN", precision=precision)


def bulk_rs_nt(dx_partial, x_gathered, dy, *, axis_name, precision=None):
  """Column-parallel wgrad beside the reduce-scatter of dx (no data dependency):
  dx_partial [..., m, k], x_gathered [..., m, k], dy [..., m, n] ->
  (RS(dx_partial) [..., m/tp, k], x_gathered.T @ dy [k, n] summed over batch)."""
  dx = _reduce_scatter_rows(dx_partial.astype(jnp.float32), axis_name, dx_partial.dtype)
  return dx, matmul(x_gathered, dy, layout="NT", precision=precision)
