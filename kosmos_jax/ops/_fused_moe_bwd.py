"""Fused MoE backward behind kosmos_jax.ops.moe_backward: the `kosmos_moe_backward`
FFI target (csrc/moe_bwd_cuda.cu), one persistent launch that recomputes the forward's
plan from the same routing, gathers each pair's dY row into the forward's arena order,
and runs dgrad2 with the SwiGLU backward in its epilogue, dgrad1, the experts' weight
gradients and the fold of dX. It reads the fused forward's workspace (residuals.ws: the
SwiGLU activations, pre-activations and at EP = 1 the gathered x rows), so it runs after
a fused forward only. At EP > 1 (the axis_name axis of a jax.shard_map, one host's GPUs,
as the forward) each rank pushes its pairs' dY rows into the owners' arenas, then their
x rows (the forward's arena was in the symmetric heap, which the next MoE launch
reuses), and the owners push the dX rows back (kernels/moe/fwd_sched.h); the heap then
also holds an X arena (the handler names the MiB a call needs). The shared expert's
gradients are tiles of the same launch (its row blocks after the arena's, as in the forward), its
dX row folded after the k routed rows. Hopper builders on compute capability 9.0
(kernels/moe/bwd_sm90.cuh), portable ones on any other CUDA GPU or under
KOSMOS_FUSED_BUILDERS=portable (kernels/moe/bwd_portable.cuh, covered by the HIP
compile check; `kosmos_jax.testing.builder_runs()["moe_backward"]` counts which ran).

In XLA, as the twin (kosmos_jax.reference.moe.moe_backward) computes them: the
routing-weight gradients dg_j (output gating: <dY, Y_j> from the forward's expert rows;
input gating: <dX_j, x> from the launch's dX rows), then the router's (router_logit_grad:
through the score function, with the aux loss's), dX_r and dW_r. dX is the launch's fold
(rounded to bf16 once) plus the router's term in fp32, rounded once.

The FFI contract (kosmos_moe_backward, platform CUDA):
  operands  dy [t, h] bf16; indices [t, k] int32; weights [t, k] f32; w1 [E_l, h, 2I] and
            w2 [E_l, I, h] bf16 (this rank's, as the forward's); fws, the forward's workspace
            (uint8); x [t, h] (the forward's input) with a shared expert or at EP > 1, else
            (1,); with a shared expert hs [t, 2I] (its pre-activations), sw1 [h, 2I],
            sw2 [I, h] bf16, else (1,) bf16 arrays.
  attrs     (int64) input_gating (the forward's), shared, cu_cap, movers, switching (as
            the forward's; movers -1: the kernel's rule, twice the forward's movers, since
            dgrad2 eats gathered rows twice as fast as GEMM1: csrc/ffi_util.h); groups,
            ep, slots (the mesh's EP groups and their control slots, as the forward's).
  results   dx [t, h] bf16 (the experts' part of dL/dx, the shared expert's included);
            dx_rows [R + S + P, h] bf16, each pair's gradient of its expert input in arena
            order, then the shared expert's, then at EP > 1 the rows our pairs got back;
            pair_row [t, k] int32, its row of dx_rows; dw1 [E_l, h, 2I] and dw2 [E_l, I, h]
            bf16 (fp32 sums over the expert's rows in the plan's stable order, rounded
            once: bitwise reproducible); dsw1 [h, 2I] and dsw2 [I, h] bf16, the shared
            expert's (else (1,)); ws [W] uint8 scratch (workspace_bytes).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from kosmos_jax import _compat, _ext, runtime
from kosmos_jax.ops import _fused_moe as fwd
from kosmos_jax.ops._dispatch import register_fused
from kosmos_jax.ops._fused_tp import group_attrs
from kosmos_jax.reference import moe as ref
from kosmos_jax.reference.moe_config import MoEConfig

TARGET = "kosmos_moe_backward"
F32 = jnp.float32
# The weight gradients' tiles are 128 rows of dW1 [h, 2I] and of dW2 [I, h].
HIDDEN_MULTIPLE = 128


def workspace_bytes(t: int, k: int, e: int, h: int, i: int, shared: bool, ep: int = 1) -> int:
  """The backward's scratch (kernels/moe/bwd_ws.h): the control block, 32 bytes of flags
  per row block, the plan's counts and order, the pairs' dY rows (bf16 [R, h]; EP = 1
  only: at EP > 1 peers push them into the heap) and d(gate | up) (bf16 [R + S, 2I])."""
  r, s, nb = fwd.arena_rows(t, k, e, ep), fwd.shared_rows(t, shared), -(-t // fwd.BLOCK_TOKENS)
  al = lambda n: fwd._roundup(n, fwd.ALIGN)
  return (al(fwd.CTRL_BYTES) + al((r + s) // fwd.TILE_ROWS * 32) + al(nb * e * 4) + al(r * 4)
          + (al(r * h * 2) if ep == 1 else 0) + al((r + s) * 2 * i * 2))


def check_fused(op: str, res, config: MoEConfig, ep: int) -> None:
  """What the fused backward runs, refused before lowering with the values named."""
  fwd.check_fused(op, res.x, config, ep)
  if config.hidden % HIDDEN_MULTIPLE:
    raise ValueError(f"{op} (fused): hidden={config.hidden} must be a multiple of {HIDDEN_MULTIPLE} (the weight "
                     "gradients' tile rows); impl='reference' runs any shape")
  if res.ws is None:
    raise ValueError(f"{op} (fused): the residuals hold no fused forward's workspace (residuals.ws is None): the "
                     "fused backward reads the fused forward's rows; run the forward with impl='fused' too, or "
                     "the backward with impl='reference'")


moe_backward_p = Primitive(TARGET)
moe_backward_p.multiple_results = True


def _abstract(dy, indices, weights, w1, w2, fws, x, hs, sw1, sw2, *, input_gating, shared, cu_cap, movers,
              switching, axis_name, ep):
  t, h = dy.shape
  k, (el, _, two_i) = indices.shape[1], w1.shape
  e = el * ep
  r, s, p = fwd.arena_rows(t, k, e, ep), fwd.shared_rows(t, shared), fwd.return_rows(t, k, e, ep)
  return (dy.update(shape=(t, h)), dy.update(shape=(r + s + p, h)),
          dy.update(shape=(t, k), dtype=jnp.dtype(jnp.int32)), dy.update(shape=w1.shape), dy.update(shape=w2.shape),
          dy.update(shape=(h, two_i) if shared else (1,)), dy.update(shape=(two_i // 2, h) if shared else (1,)),
          dy.update(shape=(workspace_bytes(t, k, e, h, two_i // 2, shared, ep),), dtype=jnp.dtype(jnp.uint8)))


def _lowering(ctx, dy, indices, weights, w1, w2, fws, x, hs, sw1, sw2, *, input_gating, shared, cu_cap, movers,
              switching, axis_name, ep):
  none = np.zeros((0,), np.int64)
  groups = group_attrs(TARGET, ctx, axis_name, ep) if ep > 1 else dict(groups=none, slots=none)
  return jax.ffi.ffi_lowering(TARGET)(
      ctx, dy, indices, weights, w1, w2, fws, x, hs, sw1, sw2, input_gating=np.int64(input_gating),
      shared=np.int64(shared),
      cu_cap=np.int64(cu_cap or 0), movers=np.int64(-1 if movers is None else movers),
      switching=np.int64(switching), ep=np.int64(ep), **groups)


moe_backward_p.def_abstract_eval(_abstract)
mlir.register_lowering(moe_backward_p, _lowering, platform="cuda")


def launch_kernel(dy, indices, weights, w1, w2, fws, x=None, hs=None, sw1=None, sw2=None, *, input_gating: bool,
                  cu_cap=None, movers=None, switching: bool = True, axis_name=None):
  """The launch alone: (dx [t, h], dx_rows [R + S + P, h], pair_row [t, k], dw1, dw2,
  dsw1, dsw2), the last two the shared expert's when sw1 is given (with x, hs, sw2),
  else None. x, the forward's input, is needed with a shared expert and at EP > 1
  (axis_name's axis, under jax.shard_map)."""
  if not _ext.has_target(TARGET, "cuda"):
    raise NotImplementedError(f"{TARGET} is not compiled into this extension (a CUDA build with the MoE "
                              "backward handler is needed)")
  runtime.init()
  shared = sw1 is not None
  ep = 1 if axis_name is None else int(_compat.axis_size(axis_name))
  if (shared or ep > 1) and x is None:
    raise ValueError(f"{TARGET}: x, the forward's input, is needed with a shared expert and at EP > 1 ({ep=})")
  none = jnp.zeros((1,), jnp.bfloat16)
  ops_ = (dy, indices.astype(jnp.int32), weights.astype(F32), w1, w2, fws,
          x if shared or ep > 1 else none) + ((hs, sw1, sw2) if shared else (none,) * 3)
  both = frozenset().union(*(_compat.vma(a) for a in ops_))
  ops_ = tuple(_compat.pvary_to(a, both) for a in ops_)
  dx, dx_rows, pair_row, dw1, dw2, dsw1, dsw2, _ = moe_backward_p.bind(
      *ops_, input_gating=int(bool(input_gating)), shared=int(bool(shared)), cu_cap=cu_cap, movers=movers,
      switching=int(bool(switching)), axis_name=axis_name if ep > 1 else None, ep=ep)
  return dx, dx_rows, pair_row, dw1, dw2, (dsw1 if shared else None), (dsw2 if shared else None)


def moe_backward_fused(res, dy, daux, router_w, gate_up, down, shared_gate_up=None, shared_down=None, *,
                       config: MoEConfig, axis_name, cu_cap=None):
  """ops.moe_backward in one launch (operands validated by ops.moe_backward),
  after a fused forward: (dx, drouter_w, dgate_up, ddown, dshared_gate_up, dshared_down)
  as reference.moe_backward returns them."""
  op = "moe_backward"
  check_fused(op, res, config, int(_compat.axis_size(axis_name)))
  x, routing = res.x, res.routing
  dt = x.dtype
  output_gated = config.gating == "output"
  shared = shared_gate_up is not None
  sw = (res.hs, ref._flat(shared_gate_up), shared_down) if shared else ()
  dxk, dx_rows, pair_row, dw1, dw2, dsgu, dsd = launch_kernel(
      dy.astype(dt), routing.indices, routing.weights, ref._flat(gate_up), down, res.ws, x, *sw,
      input_gating=not output_gated, cu_cap=cu_cap, axis_name=axis_name)
  if output_gated:  # dg_j = <dY, Y_j>
    dw = jnp.einsum("th,tkh->tk", dy.astype(F32), res.rows.astype(F32))
  else:  # d(g_j x) = dX_j: dg_j = <dX_j, x>
    dw = jnp.einsum("th,tkh->tk", x.astype(F32), dx_rows[pair_row].astype(F32))
  dz = ref.router_logit_grad(routing, dw, daux, config, axis_name)
  dx = dxk.astype(F32) + jnp.einsum("te,he->th", dz, router_w.astype(F32))
  drouter = jnp.einsum("th,te->he", x.astype(F32), dz).astype(router_w.dtype)
  if shared:
    dsgu = dsgu.reshape(shared_gate_up.shape)
  return dx.astype(dt), drouter, dw1.reshape(gate_up.shape), dw2, dsgu, dsd


def auto_rule(res, *_, config: MoEConfig, axis_name, precision=None) -> str:
  """'' where `auto` runs the fused backward: after a fused forward (auto_rule of
  ops/_fused_moe.py held, or impl='fused'), whose workspace it reads; else why not."""
  if res.ws is None:
    return "the forward ran the reference twin, and the fused backward reads a fused forward's rows"
  if int(_compat.axis_size(axis_name)) > 1:
    return ("at EP > 1 the fused MoE layer has been run only as loopback ranks on one GPU, never measured across "
            "GPUs against the reference layer (issue 29); impl='fused' runs it")
  return fwd.refusal(check_fused, "moe_backward", res, config, int(_compat.axis_size(axis_name)),
                     precision=precision)


register_fused("moe_backward", moe_backward_fused, auto=auto_rule)
