"""Standalone tile GEMM `matmul(a, b, layout=...)` (one device, no collective).

Layouts as in `kosmos_jax.reference.matmul`: TN = a @ b, NN = a @ b.T,
NT = a.T @ b summed over batch and rows. It is the GEMM of the unfused arms of
the benchmarks and the row-parallel weight gradient.
"""
from __future__ import annotations

import functools

from kosmos_jax import reference
from kosmos_jax.ops import _checks as chk
from kosmos_jax.ops._dispatch import choose, run_fused
from kosmos_jax.ops.tp import check_precision
from kosmos_jax.reference.matmul import LAYOUTS


def _validate(a, b, layout: str) -> None:
  op = "matmul"
  if layout not in LAYOUTS:
    raise ValueError(f"{op}: layout={layout!r} must be one of {LAYOUTS}")
  chk.dtypes(op, a=a, b=b)
  chk.ndim_at_least(op, "a", a, 2)
  if layout == "NT":
    chk.ndim_at_least(op, "b", b, 2)
    chk.same_leading(op, a=a, b=b)
    chk.equal(op, "rows", **{"a.shape[-2]": a.shape[-2], "b.shape[-2]": b.shape[-2]})
    return
  chk.rank2(op, "b", b)
  axis = 0 if layout == "TN" else 1
  chk.equal(op, "contraction sizes", **{"a.shape[-1]": a.shape[-1], f"b.shape[{axis}]": b.shape[axis]})


def matmul(a, b, *, layout: str, impl=None, cu_cap=None, precision=None):
  """GEMM in `layout` ('TN', 'NN' or 'NT'), fp32 accumulation, output in a.dtype."""
  _validate(a, b, layout)
  if cu_cap is not None and (not isinstance(cu_cap, int) or cu_cap < 1):
    raise ValueError(f"matmul: cu_cap={cu_cap!r} must be a positive int or None")
  twin = functools.partial(reference.matmul, layout=layout, precision=precision)
  if choose("matmul", impl) == "fused":
    check_precision("matmul", precision)
    return run_fused("matmul", twin, (a, b), dict(layout=layout, cu_cap=cu_cap))
  return twin(a, b)
