"""Fused standalone GEMM behind `kosmos_jax.ops.matmul`: the `kosmos_matmul` FFI
target (csrc/matmul_cuda.cu) over the tile engines in kernels/gemm.

Leading batch dims are folded into rows, so the kernel always sees 2-D operands:
  TN: a [..., m, k] -> [rows, k],  b [k, n]         -> out [rows, n] -> [..., m, n]
  NN: a [..., m, n] -> [rows, n],  b [k, n]         -> out [rows, k] -> [..., m, k]
  NT: a [..., m, k] -> [rows, k],  b [..., m, n] -> [rows, n]         -> out [k, n]
bf16 on an H100/H200 (compute capability 9.0) runs the Hopper engine; f16, f32,
other GPUs and shapes TMA cannot describe (a leading dim not a multiple of 8)
run the portable engine. `kosmos_jax.testing.engine_runs()` says which ran, per
launch count.

Registered with the dispatcher at import; `choose` still refuses it unless the
CUDA extension is built and a GPU is visible.
"""
from __future__ import annotations

import functools

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from kosmos_jax import _compat, _ext, reference
from kosmos_jax.ops._dispatch import register_fused
from kosmos_jax.reference.matmul import LAYOUTS

matmul_p = Primitive("kosmos_matmul")


def _out_2d(a_shape, b_shape, layout):
  """Engine output [M, N] of the folded 2-D operands (kernels/gemm/tile_problem.h)."""
  if layout == "TN":
    return a_shape[0], b_shape[1]
  if layout == "NN":
    return a_shape[0], b_shape[0]
  return a_shape[1], b_shape[1]  # NT


def _abstract(a, b, *, layout, cu_cap):
  # Same dtype and manual-axes typing as a (operands were given a's and b's union).
  return a.update(shape=_out_2d(a.shape, b.shape, layout))


def _lowering(ctx, a, b, *, layout, cu_cap):
  return jax.ffi.ffi_lowering("kosmos_matmul")(
      ctx, a, b, layout=np.int64(LAYOUTS.index(layout)), cu_cap=np.int64(cu_cap or 0))


matmul_p.def_abstract_eval(_abstract)
mlir.register_lowering(matmul_p, _lowering, platform="cuda")


@functools.partial(jax.jit, static_argnames=("layout", "cu_cap"))
def _call_2d(a, b, *, layout, cu_cap):
  # jit gives the primitive an eager path too (it has no impl rule of its own).
  return matmul_p.bind(a, b, layout=layout, cu_cap=cu_cap)


def matmul_fused(a, b, *, layout: str, cu_cap=None):
  """ops.matmul on the tile engines; operands already validated by ops.matmul."""
  if not _ext.has_target("kosmos_matmul", "cuda"):
    raise NotImplementedError("kosmos_matmul is not compiled into this extension (CUDA build needed)")
  if a.size == 0 or b.size == 0:
    return reference.matmul(a, b, layout=layout)  # nothing to launch: zeros or an empty result
  both = _compat.vma(a) | _compat.vma(b)
  a2 = _compat.pvary_to(a, both).reshape(-1, a.shape[-1])
  b2 = _compat.pvary_to(b, both)
  b2 = b2.reshape(-1, b.shape[-1]) if layout == "NT" else b2
  y = _call_2d(a2, b2, layout=layout, cu_cap=cu_cap)
  if layout == "NT":
    return y
  return y.reshape(*a.shape[:-1], y.shape[-1])


# Not the `auto` default: 0.89-0.92x of XLA's cuBLAS dot (geomean, paper shapes,
# benchmarks/RESULTS.md), so auto keeps XLA's dot until the engine catches up.
register_fused("matmul", matmul_fused)
