"""Reference twin of the standalone tile GEMM (`ops.matmul`), in the paper's three
layouts. Operands are row-major JAX arrays; the layout names the training pass:

  TN (fprop): a [..., m, k], b [k, n]     -> a @ b          [..., m, n]
  NN (dgrad): a [..., m, n], b [k, n]     -> a @ b.T        [..., m, k]
  NT (wgrad): a [..., m, k], b [..., m, n] -> sum a.T @ b   [k, n]  (over batch and m)

Products accumulate in fp32 and are rounded once to the operands' dtype.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

LAYOUTS = ("TN", "NN", "NT")


def _dot(a, b, contract, out_dtype, precision=None):
  y = jax.lax.dot_general(a, b, (contract, ((), ())), precision=precision, preferred_element_type=jnp.float32)
  return y.astype(out_dtype)


def matmul(a, b, *, layout: str, precision=None):
  """`precision`: jax.lax.dot_general's (None: JAX's default for the dtype)."""
  if layout == "TN":
    return _dot(a, b, ((a.ndim - 1,), (0,)), a.dtype, precision)
  if layout == "NN":
    return _dot(a, b, ((a.ndim - 1,), (1,)), a.dtype, precision)
  if layout == "NT":
    rows = tuple(range(a.ndim - 1))  # batch dims and m are all contracted
    return _dot(a, b, (rows, rows), a.dtype, precision)
  raise ValueError(f"layout={layout!r} must be one of {LAYOUTS}")
