"""Fused bulk RS || NT (kernels/tp/bulk_rs.cuh) behind kosmos_jax.ops.bulk_rs_nt: the
column-parallel weight gradient, dw = x_gathered.T @ dy, beside the reduce-scatter of
the data gradient's partials, in one persistent kernel. A primitive with two outputs
whose lowering passes the mesh's device groups (kosmos_jax.ops._fused_tp), then emits
the `kosmos_bulk_rs_nt` FFI custom call.

Registered with the dispatcher at import; `choose` still refuses it unless the CUDA
extension is built and a GPU is visible.
"""
from __future__ import annotations

import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from kosmos_jax import _compat, _ext, runtime
from kosmos_jax import kernel_config as _config
from kosmos_jax.kernel_config import AgConfig
from kosmos_jax.ops._dispatch import register_fused
from kosmos_jax.ops._fused_tp import _axis, _rank_major, crew_lowering

bulk_rs_nt_p = Primitive("kosmos_bulk_rs_nt")
bulk_rs_nt_p.multiple_results = True


def _abstract(dxp, xg, dy, *, axis_name, tp, cu_cap, movers, switching):
  # The kernel is 2-D: dxp [tp*rows, k] -> dx [rows, k], varying like dx_partial;
  # xg [M, k], dy [M, n] -> dw [k, n], varying like both (the caller makes xg and
  # dy vary alike).
  return (dxp.update(shape=(dxp.shape[0] // tp, dxp.shape[1])), xg.update(shape=(xg.shape[1], dy.shape[1])))


bulk_rs_nt_p.def_abstract_eval(_abstract)
mlir.register_lowering(bulk_rs_nt_p, crew_lowering("bulk_rs_nt"), platform="cuda")


def bulk_rs_nt_fused(dx_partial, x_gathered, dy, *, axis_name, config: AgConfig):
  """(reduce_scatter_rows(dx_partial), x_gathered.T @ dy) in one persistent kernel.

  dx_partial [..., m, k] -> dx [..., m/tp, k], summed over the group in fp32 in rank
  order and rounded once (bitwise reproducible); x_gathered [..., m, k] and dy
  [..., m, n] -> dw [k, n], summed over the batch and the rows. Movers push each
  band of dx_partial into the heap of the rank that owns it while the other CTAs
  build dw's tiles; a mover whose pushes are done builds, and every CTA whose GEMM
  queue is empty reduces its own rank's bands (kernels/tp/bulk_rs_sched.h).

  bf16 on an H100/H200 with k and n multiples of 8 builds dw with the Hopper engine
  (kernels/tp/bulk_rs_sm90.cuh); other dtypes and GPUs, and
  KOSMOS_FUSED_BUILDERS=portable, with the portable one;
  `kosmos_jax.testing.builder_runs()` counts which ran. `config` (AgConfig,
  resolved by ops.bulk_rs_nt): `movers`, CTAs that start pushing (None: the AG
  rule of the output width n, since GEMM work per byte moved is n here too; 0:
  every CTA builds first); `switching=False`: a fixed split, where movers push
  and reduce and builders only build (needs a grid of >= 2 CTAs). The transport
  is always push, so config.transport must stay the default."""
  if not _ext.has_target("kosmos_bulk_rs_nt", "cuda"):
    raise NotImplementedError("kosmos_bulk_rs_nt is not compiled into this extension (CUDA build needed)")
  cfg = config
  if cfg.transport != "pull":
    raise ValueError(f"bulk_rs_nt (fused): transport={cfg.transport!r} is not a choice here; its "
                     "reduce-scatter always pushes, so leave AgConfig.transport at its default")
  runtime.init()  # trace time: heaps exist before any kernel runs
  tp = int(_compat.axis_size(axis_name))
  *lead, m, k = dx_partial.shape
  n = int(dy.shape[-1])
  if m % tp:
    raise ValueError(f"bulk_rs_nt_fused: m={m} rows must divide by tp={tp}")
  mv = _config.ag_movers(n) if cfg.movers is None else cfg.movers
  both = _compat.vma(x_gathered) | _compat.vma(dy)  # dw varies like both of its operands
  xg = _compat.pvary_to(x_gathered, both).reshape(-1, k)
  dy2 = _compat.pvary_to(dy, both).reshape(-1, n)
  dx, dw = bulk_rs_nt_p.bind(_rank_major(dx_partial, tp), xg, dy2, axis_name=_axis(axis_name), tp=tp,
                             cu_cap=cfg.cu_cap, movers=mv, switching=cfg.switching)
  return dx.reshape(*lead, m // tp, k), dw


# Selected by impl="fused" / KOSMOS_IMPL=fused only, until measured faster than
# XLA's reduce-scatter + dot.
register_fused("bulk_rs_nt", bulk_rs_nt_fused)
