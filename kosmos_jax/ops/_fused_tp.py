"""Fused TP+SP kernels behind kosmos_jax.ops.tp: primitives whose lowering reads the
concrete mesh (shard_map's axis context) to pass the groups of global device ids as
a static attribute, then emits the `kosmos_<op>` FFI custom call.

Registered with the dispatcher at import; `choose` still refuses them unless the
CUDA extension is built and a GPU is visible.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from kosmos_jax import _compat, _ext, runtime
from kosmos_jax.config import AgConfig
from kosmos_jax.ops._dispatch import register_fused

ag_tn_p = Primitive("kosmos_ag_tn")


def _ag_tn_abstract(x, w, *, axis_name, tp, cu_cap, movers):
  # Same dtype and manual-axes typing as x (the gathered rows vary like x does).
  return x.update(shape=(*x.shape[:-2], x.shape[-2] * tp, w.shape[1]))


def _mesh_of(ctx, op):
  mesh = getattr(ctx.module_context.axis_context, "mesh", None)
  if mesh is None or not hasattr(mesh, "devices"):
    raise NotImplementedError(f"{op}: the fused kernel must run inside jax.shard_map over a concrete "
                              "jax.sharding.Mesh (it takes its device groups from the mesh)")
  return mesh


def _ag_tn_lowering(ctx, x, w, *, axis_name, tp, cu_cap, movers):
  groups = runtime.groups_from_mesh(_mesh_of(ctx, "ag_tn"), axis_name)
  if groups.shape[1] != tp:
    raise ValueError(f"ag_tn: group size {groups.shape[1]} from the mesh != axis size {tp}")
  runtime.check_groups("ag_tn", groups)
  return jax.ffi.ffi_lowering("kosmos_ag_tn")(
      ctx, x, w, groups=np.ascontiguousarray(groups.reshape(-1), np.int64), tp=np.int64(tp),
      slots=runtime.ctrl_slots(groups),
      cu_cap=np.int64(cu_cap or 0), movers=np.int64(-1 if movers is None else movers))


ag_tn_p.def_abstract_eval(_ag_tn_abstract)
mlir.register_lowering(ag_tn_p, _ag_tn_lowering, platform="cuda")


def ag_tn_fused(x, w, *, axis_name, cu_cap=None, movers=None):
  """allgather_rows(x) @ w in one persistent kernel (kernels/tp/ag_gemm.cuh)."""
  if not _ext.has_target("kosmos_ag_tn", "cuda"):
    raise NotImplementedError("kosmos_ag_tn is not compiled into this extension (CUDA build needed)")
  cfg = AgConfig(cu_cap=cu_cap, movers=movers)
  runtime.init()  # trace time: heaps exist before any kernel runs
  tp = int(_compat.axis_size(axis_name))
  if isinstance(axis_name, list):
    axis_name = tuple(axis_name)
  return ag_tn_p.bind(x, w, axis_name=axis_name, tp=tp, cu_cap=cfg.cu_cap, movers=cfg.movers)


# Not the `auto` default: correct on 2xH200, but its portable SIMT builders run
# ~40x slower than XLA's all-gather + cuBLAS (benchmarks/RESULTS.md) until the
# Hopper tile engine builds its tiles.
register_fused("ag_tn", ag_tn_fused)
