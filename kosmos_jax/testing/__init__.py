"""Facilities for kosmos_jax's own tests and benchmarks, not user API: the one-GPU
loopback runner (`kosmos_jax.testing.loopback`), which runs every rank of a fused
call as a concurrent launch on one GPU, and the hooks below, so that tests and
scripts reach the fused kernels through the public ops and never import a private
module of `kosmos_jax.ops`.

  builder_runs()   fused TP+SP and MoE forward launches per builder engine (which ran)
  engine_runs()    fused matmul launches per tile engine
  matmul_flops()   2*M*N*K of one ops.matmul call
  fused_ops()      the ops with a fused kernel registered
  fake_fused()     stand-in fused kernels for CPU tests of the dispatch
  fused_on_cpu()   lets the real fused wrappers trace and lower without a GPU
  moe_forward_kernel()  the fused MoE forward's launch alone, on given routing:
                   (y, y_rows, pair_row, hs); moe_arena_rows() / moe_shared_rows() /
                   moe_return_rows() / moe_workspace_bytes() its R, S, P and W (moe_backward_workspace_bytes()
                   the backward's W); moe_forward_built() whether
                   its target is compiled; moe_forward_xla_part() what the fused
                   forward runs in XLA before it (the routing)
  grouped_gemm     the MoE expert GEMMs alone (`kosmos_grouped_gemm`): the MoE
                   benchmark's floor (kosmos_jax/testing/grouped_gemm.py)
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable

import numpy as np

from kosmos_jax import _ext, runtime
from kosmos_jax.kernel_config import MoeLaunch
from kosmos_jax.ops import _dispatch, _fused_bulk_rs, _fused_gemm, _fused_moe, _fused_moe_bwd, _fused_tp
from kosmos_jax.reference import moe_router as rt
from kosmos_jax.testing import grouped_gemm  # noqa: F401  (kosmos_jax.testing.grouped_gemm)

TP_OPS = ("ag_tn", "tn_rs", "ag_nn", "bulk_ag_nn", "bulk_rs_nt")
# The fused ops whose handlers count their launches per builder engine (sm90, portable).
BUILDER_OPS = TP_OPS + ("moe_forward", "moe_backward")
# The module attribute holding each fused op's primitive (what fused_on_cpu can stand in for).
_PRIMITIVES = {"ag_tn": (_fused_tp, "ag_tn_p"), "tn_rs": (_fused_tp, "tn_rs_p"),
               "ag_nn": (_fused_tp, "ag_nn_p"), "bulk_ag_nn": (_fused_tp, "bulk_ag_nn_p"),
               "bulk_rs_nt": (_fused_bulk_rs, "bulk_rs_nt_p"), "matmul": (_fused_gemm, "matmul_p"),
               "moe_forward": (_fused_moe, "moe_forward_p")}
def moe_forward_built() -> bool:
  """Whether the extension exports the fused MoE forward's target (a CUDA build
  with its handler)."""
  return _ext.has_target(_fused_moe.TARGET, "cuda")


moe_arena_rows = _fused_moe.arena_rows
moe_shared_rows = _fused_moe.shared_rows
moe_return_rows = _fused_moe.return_rows
moe_forward_xla_part = _fused_moe.xla_part
moe_pick_experts = _fused_moe.pick_experts
moe_workspace_bytes = _fused_moe.workspace_bytes
moe_backward_workspace_bytes = _fused_moe_bwd.workspace_bytes
MOE_TILE_ROWS = _fused_moe.TILE_ROWS


def moe_forward_kernel(x, indices, weights, w1, w2, sw1=None, sw2=None, *, input_gating: bool, cu_cap=None,
                       launch: MoeLaunch | None = None, keep_preacts: bool = True):
  """The fused MoE forward's launch alone (EP = 1, any jit or shard_map context), on
  routing made elsewhere: x [t, h] bf16, indices [t, k] int32, weights [t, k] f32,
  w1 [E, h, 2I] and w2 [E, I, h] bf16, sw1 [h, 2I] and sw2 [I, h] bf16 (the shared
  expert's, run in the launch and folded after the routed rows) or None. Returns
  (y [t, h], y_rows [R + S, h], pair_row [t, k], hs [t, 2I] or None): every pair's
  expert output row in arena order (then the shared expert's S rows, token order),
  where pair (token, slot) is, and the shared expert's bf16 pre-activations (None
  with keep_preacts=False: a launch that keeps none, as a forward outside a gradient)."""
  return _fused_moe.launch_kernel(x, indices, weights, w1, w2, sw1, sw2, input_gating=input_gating,
                                  cu_cap=cu_cap, launch=launch or MoeLaunch(), keep_preacts=keep_preacts)


def builder_runs() -> dict[str, dict[str, int]]:
  """Fused launches per builder engine since the process started,
  {'ag_tn': {'sm90': n, 'portable': n}, 'tn_rs': {...}, ..., 'moe_forward': {...}} for
  every fused TP+SP op and the MoE forward compiled into the extension (the
  extension's `<op>_engine_runs` counters)."""
  mod, why = _ext._module()
  if mod is None or not hasattr(mod, "ag_tn_engine_runs"):
    raise NotImplementedError(f"fused builder counters unavailable: {why or 'extension built without CUDA'}")
  return {op: dict(getattr(mod, f"{op}_engine_runs")()) for op in BUILDER_OPS if hasattr(mod, f"{op}_engine_runs")}


def engine_runs() -> dict[str, int]:
  """kosmos_matmul launches per engine since the process started
  ('sm90_128x256', 'sm90_128x128', 'sm90_128x192', 'portable')."""
  mod, why = _ext._module()
  if mod is None or not hasattr(mod, "matmul_engine_runs"):
    raise NotImplementedError(f"kosmos_matmul engine counters unavailable: {why or 'extension built without CUDA'}")
  return dict(mod.matmul_engine_runs())


def matmul_flops(a_shape, b_shape, layout: str) -> float:
  """2 * M * N * K of one ops.matmul call (leading dims of a folded into rows)."""
  rows = math.prod(a_shape[:-1])
  if layout == "TN":
    return 2.0 * rows * a_shape[-1] * b_shape[1]
  if layout == "NN":
    return 2.0 * rows * a_shape[-1] * b_shape[0]
  if layout == "NT":
    return 2.0 * rows * a_shape[-1] * b_shape[-1]
  raise ValueError(f"matmul_flops: layout={layout!r} must be one of ('TN', 'NN', 'NT')")


def fused_ops() -> frozenset[str]:
  """Ops whose fused kernel is registered with the dispatcher (built or not)."""
  return frozenset(_dispatch._FUSED)


@contextlib.contextmanager
def _patched(obj, name, value):
  old = getattr(obj, name)
  setattr(obj, name, value)
  try:
    yield
  finally:
    setattr(obj, name, old)


@contextlib.contextmanager
def fake_fused(kernels: dict[str, Callable], *, auto: bool | Callable[..., str] | None = False):
  """Within the block, each `kernels[op]` is `op`'s fused kernel and runs here
  (no extension or GPU needed); `auto=True` (or a rule, as register_fused takes) also
  makes it `auto`'s choice, `auto=None` keeps each op's own registration.

  A kernel is called as the fused wrapper is: the op's arrays, then its static
  keyword arguments (axis_name, ..., and `config=` for the TP+SP ops, `cu_cap=`
  for matmul). Ops not named keep their real status. The registry is restored on
  exit, so a test's stand-ins never leak into another test."""
  fused, autos, status = dict(_dispatch._FUSED), dict(_dispatch._AUTO), _dispatch.fused_status
  for op, fn in kernels.items():
    _dispatch.register_fused(op, fn, auto=autos.get(op, False) if auto is None else auto)

  def fake_status(op):
    return (True, "") if op in kernels else status(op)

  _dispatch.fused_status = fake_status
  try:
    yield
  finally:
    _dispatch._FUSED.clear()
    _dispatch._FUSED.update(fused)
    _dispatch._AUTO.clear()
    _dispatch._AUTO.update(autos)
    _dispatch.fused_status = status


class _SelectTwin:
  """kosmos_moe_select's contract in JAX (moe_router.pick), for fused_on_cpu."""

  def bind(self, score, bias, *, top_k, n_groups, topk_groups, has_bias):
    return rt.pick(score, top_k=top_k, n_groups=n_groups, topk_groups=topk_groups, bias=bias if has_bias else None)


@contextlib.contextmanager
def fused_on_cpu(primitives: dict[str, object] | None = None):
  """Within the block the real fused wrappers of the registered ops run their
  Python side without a GPU: every target counts as compiled, the symmetric heap
  and its control slots are not set up, and impl='fused' is allowed. Lowering for
  'cuda' (`.lower(lowering_platforms=("cuda",))`) then shows the custom call the
  op emits. `primitives` maps an op to a stand-in for its primitive (anything
  with `.bind(*operands, **params)`, e.g. a JAX twin of the kernel's 2-D
  contract), so the operand folding around the primitive can be run on CPU."""
  with contextlib.ExitStack() as stack:
    stack.enter_context(_patched(_ext, "has_target", lambda *a: True))
    stack.enter_context(_patched(runtime, "init", lambda *a, **k: {}))
    stack.enter_context(_patched(runtime, "check_groups", lambda *a: None))
    stack.enter_context(_patched(runtime, "ctrl_slots", lambda groups: np.zeros(len(groups), np.int64)))
    for op, prim in (primitives or {}).items():
      if op not in _PRIMITIVES:
        raise ValueError(f"fused_on_cpu: no fused primitive for op={op!r}; known: {sorted(_PRIMITIVES)}")
      stack.enter_context(_patched(*_PRIMITIVES[op], prim))
    if "moe_forward" in (primitives or {}):  # its routing's selection kernel too
      stack.enter_context(_patched(_fused_moe, "moe_select_p", _SelectTwin()))
    stack.enter_context(fake_fused({op: _dispatch._FUSED[op] for op in _dispatch._FUSED}, auto=None))
    yield
