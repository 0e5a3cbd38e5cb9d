"""Fused TP+SP kernels behind kosmos_jax.ops.tp: primitives whose lowering reads the
concrete mesh (shard_map's axis context) to pass the groups of global device ids as
a static attribute, then emits the `kosmos_<op>` FFI custom call.

Registered with the dispatcher at import; `choose` still refuses them unless the
CUDA extension is built and a GPU is visible.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from kosmos_jax import _compat, _ext, runtime
from kosmos_jax import kernel_config as _config
from kosmos_jax.kernel_config import AgConfig, RsConfig
from kosmos_jax.ops._dispatch import register_fused

ag_tn_p = Primitive("kosmos_ag_tn")


def _ag_tn_abstract(x, w, *, axis_name, tp, cu_cap, movers, switching, transport):
  # Same dtype and manual-axes typing as x (the gathered rows vary like x does).
  return x.update(shape=(*x.shape[:-2], x.shape[-2] * tp, w.shape[1]))


def _mesh_of(ctx, op):
  mesh = getattr(ctx.module_context.axis_context, "mesh", None)
  if mesh is None or not hasattr(mesh, "devices"):
    raise NotImplementedError(f"{op}: the fused kernel must run inside jax.shard_map over a concrete "
                              "jax.sharding.Mesh (it takes its device groups from the mesh)")
  return mesh


def group_attrs(op, ctx, axis_name, size) -> dict:
  """The FFI attributes `groups` (this mesh's groups along axis_name, global device ids,
  row-major) and `slots` (their control slots), checked: size members each, one host,
  mapped heaps."""
  groups = runtime.groups_from_mesh(_mesh_of(ctx, op), axis_name)
  if groups.shape[1] != size:
    raise ValueError(f"{op}: group size {groups.shape[1]} from the mesh != axis size {size}")
  runtime.check_groups(op, groups)
  return dict(groups=np.ascontiguousarray(groups.reshape(-1), np.int64), slots=runtime.ctrl_slots(groups))


def _lower_group_op(op, ctx, *operands, axis_name, tp, cu_cap, **attrs):
  """The `kosmos_<op>` custom call with this mesh's groups and their control slots."""
  return jax.ffi.ffi_lowering(f"kosmos_{op}")(
      ctx, *operands, **group_attrs(op, ctx, axis_name, tp), tp=np.int64(tp), cu_cap=np.int64(cu_cap or 0),
      **attrs)


def crew_lowering(op):
  """The lowering of an op whose only knobs are its crew and switching (the
  backward kernels): the `kosmos_<op>` call over however many operands it takes."""
  def lowering(ctx, *operands, axis_name, tp, cu_cap, movers, switching):
    return _lower_group_op(op, ctx, *operands, axis_name=axis_name, tp=tp, cu_cap=cu_cap,
                           movers=np.int64(-1 if movers is None else movers), switching=np.int64(switching))
  return lowering


def _ag_tn_lowering(ctx, x, w, *, axis_name, tp, cu_cap, movers, switching, transport):
  return _lower_group_op("ag_tn", ctx, x, w, axis_name=axis_name, tp=tp, cu_cap=cu_cap,
                         movers=np.int64(-1 if movers is None else movers), switching=np.int64(switching),
                         transport=transport)  # by name: a string attribute, parsed once by the handler


ag_tn_p.def_abstract_eval(_ag_tn_abstract)
mlir.register_lowering(ag_tn_p, _ag_tn_lowering, platform="cuda")


def ag_tn_fused(x, w, *, axis_name, config: AgConfig):
  """allgather_rows(x) @ w in one persistent kernel.

  bf16 on an H100/H200 (compute capability 9.0) builds tiles with the Hopper
  engine (kernels/tp/ag_gemm_sm90.cuh). Other dtypes and GPUs, and
  KOSMOS_FUSED_BUILDERS=portable, use portable builders (kernels/tp/ag_gemm.cuh)
  in the same CTA life: builders never move, so with peers at least one CTA
  starts as a mover (`movers=0` runs as 1). `kosmos_jax.testing.builder_runs()`
  counts which ran. `config` (AgConfig, resolved by ops.ag_tn): `switching=False`
  turns the one-way mover -> builder switch off (a fixed split, benchmarks);
  `transport="push"` (Hopper builders only) has movers write their rows into the
  peers' heaps instead of the peers pulling them."""
  if not _ext.has_target("kosmos_ag_tn", "cuda"):
    raise NotImplementedError("kosmos_ag_tn is not compiled into this extension (CUDA build needed)")
  cfg = config
  runtime.init()  # trace time: heaps exist before any kernel runs
  mv = _config.ag_movers(int(w.shape[-1])) if cfg.movers is None else cfg.movers
  tp = int(_compat.axis_size(axis_name))
  if isinstance(axis_name, list):
    axis_name = tuple(axis_name)
  return ag_tn_p.bind(x, w, axis_name=axis_name, tp=tp, cu_cap=cfg.cu_cap, movers=mv, switching=cfg.switching,
                      transport=cfg.transport)


def _sm_count() -> int | None:
  """SMs of this process's first GPU (all of a group's GPUs are alike), or None."""
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  return getattr(gpus[0], "core_count", None) if gpus else None


# Not the `auto` default: measured at TP 2 only (1.14x XLA's all-gather + cuBLAS
# geomean on 2xH200, pull), so impl="fused" asks for it (benchmarks/RESULTS.md).
register_fused("ag_tn", ag_tn_fused)


# ---- ag_nn: dX = all_gather_rows(dY) @ w.T, and the gathered dY ---------------
ag_nn_p = Primitive("kosmos_ag_nn")
ag_nn_p.multiple_results = True


def _ag_nn_abstract(dy, w, *, axis_name, tp, cu_cap, movers, switching):
  rows = dy.shape[-2] * tp
  return (dy.update(shape=(*dy.shape[:-2], rows, w.shape[0])), dy.update(shape=(*dy.shape[:-2], rows, dy.shape[-1])))


ag_nn_p.def_abstract_eval(_ag_nn_abstract)
mlir.register_lowering(ag_nn_p, crew_lowering("ag_nn"), platform="cuda")


def _check_row_bytes(op: str, name: str, a) -> None:
  # Movers copy each batch's run of gathered rows as 16-byte vectors, and the
  # runs start on row boundaries of the gathered output.
  row = int(a.shape[-1]) * a.dtype.itemsize
  if row % 16:
    raise ValueError(f"{op} (fused): rows of {name} are {row} bytes ({name}.shape[-1]={a.shape[-1]} x "
                     f"{a.dtype.itemsize}); the fused kernel needs a multiple of 16 bytes (impl='reference' "
                     "runs any width)")


def _axis(axis_name):
  return tuple(axis_name) if isinstance(axis_name, list) else axis_name


def ag_nn_fused(dy, w, *, axis_name, return_gathered=False, config: AgConfig):
  """all_gather_rows(dy) @ w.T in one persistent kernel (the row-parallel dgrad),
  and all_gather_rows(dy) itself, written once by the movers as they deliver it
  (the weight gradient's operand). The movers, transport and knobs are ag_tn's
  (AgConfig; Hopper builders for bf16 on sm_90 with the engine's NN layout);
  only the pull transport gathers into the returned array."""
  if not _ext.has_target("kosmos_ag_nn", "cuda"):
    raise NotImplementedError("kosmos_ag_nn is not compiled into this extension (CUDA build needed)")
  cfg = config
  if cfg.transport != "pull":
    raise ValueError(f"ag_nn (fused): transport={cfg.transport!r} is not supported; the fused ag_nn gathers "
                     "by pull (its movers write the returned gathered dy as they pull it)")
  _check_row_bytes("ag_nn", "dy", dy)
  runtime.init()  # trace time: heaps exist before any kernel runs
  mv = _config.ag_movers(int(w.shape[0])) if cfg.movers is None else cfg.movers
  tp = int(_compat.axis_size(axis_name))
  dx, dy_g = ag_nn_p.bind(dy, w, axis_name=_axis(axis_name), tp=tp, cu_cap=cfg.cu_cap, movers=mv,
                          switching=cfg.switching)
  return (dx, dy_g) if return_gathered else dx


register_fused("ag_nn", ag_nn_fused)


# ---- bulk_ag_nn: (all_gather_rows(x), dy @ w.T) in one launch -----------------
bulk_ag_nn_p = Primitive("kosmos_bulk_ag_nn")
bulk_ag_nn_p.multiple_results = True


def _bulk_ag_nn_abstract(x, dy, w, *, axis_name, tp, cu_cap, movers, switching):
  return (x.update(shape=(*x.shape[:-2], x.shape[-2] * tp, x.shape[-1])),
          dy.update(shape=(*dy.shape[:-1], w.shape[0])))


bulk_ag_nn_p.def_abstract_eval(_bulk_ag_nn_abstract)
mlir.register_lowering(bulk_ag_nn_p, crew_lowering("bulk_ag_nn"), platform="cuda")


def bulk_ag_nn_fused(x, dy, w, *, axis_name, config: AgConfig):
  """(all_gather_rows(x), dy @ w.T) in one persistent kernel: the gather the
  column-parallel weight gradient needs runs beside the dgrad GEMM, which needs
  no gathered row. Movers pull peers' rows straight into the gathered output
  and build once the gather is done (AgConfig's movers and switching; pull)."""
  if not _ext.has_target("kosmos_bulk_ag_nn", "cuda"):
    raise NotImplementedError("kosmos_bulk_ag_nn is not compiled into this extension (CUDA build needed)")
  cfg = config
  if cfg.transport != "pull":
    raise ValueError(f"bulk_ag_nn (fused): transport={cfg.transport!r} is not supported; its movers pull "
                     "peers' rows straight into the gathered output")
  _check_row_bytes("bulk_ag_nn", "x", x)
  runtime.init()
  mv = _config.ag_movers(int(w.shape[0])) if cfg.movers is None else cfg.movers
  tp = int(_compat.axis_size(axis_name))
  xg, dxp = bulk_ag_nn_p.bind(x, dy, w, axis_name=_axis(axis_name), tp=tp, cu_cap=cfg.cu_cap, movers=mv,
                              switching=cfg.switching)
  return xg, dxp


register_fused("bulk_ag_nn", bulk_ag_nn_fused)


# ---- tn_rs: Y = reduce_scatter_rows(X @ W) (kernels/tp/gemm_rs.cuh) -------------
tn_rs_p = Primitive("kosmos_tn_rs")


def _tn_rs_abstract(x, w, *, axis_name, tp, cu_cap, reducers, stage, switching, band_rows, transport):
  # The kernel is 2-D: x [tp*rows, k] -> y [rows, n]; same manual-axes typing as x.
  return x.update(shape=(x.shape[0] // tp, w.shape[1]))


def _tn_rs_lowering(ctx, x, w, *, axis_name, tp, cu_cap, reducers, stage, switching, band_rows, transport):
  return _lower_group_op("tn_rs", ctx, x, w, axis_name=axis_name, tp=tp, cu_cap=cu_cap,
                         reducers=np.int64(-1 if reducers is None else reducers),
                         stage_bf16=np.int64(stage == "bf16"), switching=np.int64(switching),
                         band_rows=np.int64(band_rows), transport=transport)


tn_rs_p.def_abstract_eval(_tn_rs_abstract)
mlir.register_lowering(tn_rs_p, _tn_rs_lowering, platform="cuda")


def _rank_major(x, tp):
  """[..., m, k] -> [tp*B*(m/tp), k] with rank c's output rows contiguous (chunk c).

  The kernel scatters contiguous row chunks, but with leading batch dims rank c's
  rows are every batch's c-th block of m/tp rows, so for B > 1 this is a
  transpose: one extra read and write of x (B*m*k elements) before the kernel.
  B == 1 is a free reshape."""
  *lead, m, k = x.shape
  b = int(np.prod(lead, dtype=np.int64)) if lead else 1
  if b == 1:
    return x.reshape(m, k)
  return x.reshape(b, tp, m // tp, k).transpose(1, 0, 2, 3).reshape(m * b, k)


def tn_rs_fused(x, w, *, axis_name, config: RsConfig):
  """reduce_scatter_rows(x @ w) in one persistent kernel: x [..., m, k] -> [..., m/tp, n],
  summed over the group in fp32 in rank order and rounded once (bitwise reproducible).

  bf16 on an H100/H200 with m/tp rows a multiple of 128 (and k, n multiples of 8)
  builds tiles with the Hopper engine (kernels/tp/gemm_rs_sm90.cuh), whose reducers
  wait for builders instead of building; otherwise, and with
  KOSMOS_FUSED_BUILDERS=portable, portable builders (kernels/tp/gemm_rs.cuh).
  `kosmos_jax.testing.builder_runs()` counts which ran. `config` (RsConfig,
  resolved by ops.tn_rs): `stage` (None: "bf16" for bf16 inputs, else "fp32"), the
  partial tiles' dtype; `switching=False` turns the one-way builder -> reducer
  switch off (a fixed split, benchmarks); `band_rows`: tile rows per band for the
  Hopper builders; `transport="push"`
  (Hopper builders only): builders write partials into their owner's heap, reducers
  read locally (RsConfig); `transport="push_fold"`: pushed as well, and each owner
  sums its chunk in its builders' epilogues instead of a reducer pass. The result
  is bitwise the same with every transport."""
  if not _ext.has_target("kosmos_tn_rs", "cuda"):
    raise NotImplementedError("kosmos_tn_rs is not compiled into this extension (CUDA build needed)")
  stage = config.stage or ("bf16" if x.dtype == jnp.bfloat16 else "fp32")
  cfg = dataclasses.replace(config, stage=stage)
  if cfg.stage == "bf16" and x.dtype != jnp.bfloat16:
    raise ValueError(f"tn_rs_fused: stage='bf16' needs bf16 inputs, got x.dtype={x.dtype}")
  runtime.init()  # trace time: heaps exist before any kernel runs
  tp = int(_compat.axis_size(axis_name))
  if isinstance(axis_name, list):
    axis_name = tuple(axis_name)
  *lead, m, _ = x.shape
  if m % tp:
    raise ValueError(f"tn_rs_fused: m={m} rows must divide by tp={tp}")
  if cfg.transport == "push_fold":
    red = 0  # every CTA builds; the fold has no reduce queue
  elif cfg.reducers is None:
    red = _config.rs_reducers(int(w.shape[0]), cfg.cu_cap, _sm_count())
  else:
    red = cfg.reducers
  bands = cfg.band_rows
  if bands is None:
    bands = _config.rs_band_rows(int(w.shape[1]), int(w.shape[0]), w.dtype.itemsize)
  y = tn_rs_p.bind(_rank_major(x, tp), w, axis_name=axis_name, tp=tp, cu_cap=cfg.cu_cap, reducers=red,
                   stage=cfg.stage, switching=cfg.switching, band_rows=bands, transport=cfg.transport)
  return y.reshape(*lead, m // tp, w.shape[1])


# Not the `auto` default either: measured at TP 2 only (Hopper builders, 1.14x XLA's
# dot + psum_scatter geomean on 2xH200, 2 of 24 shapes 1-3% slower; benchmarks/RESULTS.md).
register_fused("tn_rs", tn_rs_fused)
