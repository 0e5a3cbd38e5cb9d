"""Fused MoE backward behind kosmos_jax.ops.moe_backward (EP = 1): the
`kosmos_moe_backward` FFI target (csrc/moe_bwd_cuda.cu), one persistent launch that
recomputes the forward's plan from the same routing, gathers each pair's dY row into the
forward's arena order, and runs dgrad2 with the SwiGLU backward in its epilogue, dgrad1,
the experts' weight gradients and the fold of dX. It reads the
fused forward's workspace (residuals.ws: the gathered x rows, SwiGLU activations and
pre-activations), so it runs after a fused forward only. The shared expert's gradients
are tiles of the same launch (its row blocks after the arena's, as in the forward), its
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
  operands  dy [t, h] bf16; indices [t, k] int32; weights [t, k] f32; w1 [E, h, 2I] and
            w2 [E, I, h] bf16 (as the forward's); fws, the forward's workspace (uint8); with
            a shared expert x [t, h] (the forward's input), hs [t, 2I] (its
            pre-activations), sw1 [h, 2I], sw2 [I, h] bf16, else (1,) bf16 arrays.
  attrs     (int64) input_gating (the forward's), shared, cu_cap, movers, switching (as
            the forward's; movers -1: the kernel's rule, twice the forward's movers, since
            dgrad2 eats gathered rows twice as fast as GEMM1: csrc/ffi_util.h).
  results   dx [t, h] bf16 (the experts' part of dL/dx, the shared expert's included);
            dx_rows [R + S, h] bf16, each pair's gradient of its expert input in arena
            order, then the shared expert's; pair_row [t, k] int32; dw1 [E, h, 2I] and
            dw2 [E, I, h] bf16 (fp32 sums over the expert's rows in the plan's stable
            order, rounded once: bitwise reproducible); dsw1 [h, 2I] and dsw2 [I, h] bf16,
            the shared expert's (else (1,)); ws [W] uint8 scratch (workspace_bytes).
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
from kosmos_jax.reference import moe as ref
from kosmos_jax.reference.moe_config import MoEConfig

TARGET = "kosmos_moe_backward"
F32 = jnp.float32
# The weight gradients' tiles are 128 rows of dW1 [h, 2I] and of dW2 [I, h].
HIDDEN_MULTIPLE = 128


def workspace_bytes(t: int, k: int, e: int, h: int, i: int, shared: bool) -> int:
  """The backward's scratch (kernels/moe/bwd_ws.h): the control block, 32 bytes of flags
  per row block, the plan's counts and order, the pairs' dY rows (bf16 [R, h]) and
  d(gate | up) (bf16 [R + S, 2I])."""
  r, s, nb = fwd.arena_rows(t, k, e), fwd.shared_rows(t, shared), -(-t // fwd.BLOCK_TOKENS)
  al = lambda n: fwd._roundup(n, fwd.ALIGN)
  return (al(fwd.CTRL_BYTES) + al((r + s) // fwd.TILE_ROWS * 32) + al(nb * e * 4) + al(r * 4) + al(r * h * 2)
          + al((r + s) * 2 * i * 2))


def check_fused(op: str, res, config: MoEConfig, ep: int) -> None:
  """What the fused backward runs, refused before lowering with the values named."""
  if ep != 1:
    raise NotImplementedError(
        f"{op}: the fused MoE backward runs at EP = 1 only so far (the axis_name axis has size {ep}); "
        "use impl='reference' for the backward at EP > 1 (moe_layer and nn.MoE do so after a fused forward)")
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
              switching):
  t, h = dy.shape
  k, (e, _, two_i) = indices.shape[1], w1.shape
  r, s = fwd.arena_rows(t, k, e), fwd.shared_rows(t, shared)
  return (dy.update(shape=(t, h)), dy.update(shape=(r + s, h)), dy.update(shape=(t, k), dtype=jnp.dtype(jnp.int32)),
          dy.update(shape=w1.shape), dy.update(shape=w2.shape),
          dy.update(shape=(h, two_i) if shared else (1,)), dy.update(shape=(two_i // 2, h) if shared else (1,)),
          dy.update(shape=(workspace_bytes(t, k, e, h, two_i // 2, shared),), dtype=jnp.dtype(jnp.uint8)))


def _lowering(ctx, dy, indices, weights, w1, w2, fws, x, hs, sw1, sw2, *, input_gating, shared, cu_cap, movers,
              switching):
  return jax.ffi.ffi_lowering(TARGET)(
      ctx, dy, indices, weights, w1, w2, fws, x, hs, sw1, sw2, input_gating=np.int64(input_gating),
      shared=np.int64(shared),
      cu_cap=np.int64(cu_cap or 0), movers=np.int64(-1 if movers is None else movers),
      switching=np.int64(switching))


moe_backward_p.def_abstract_eval(_abstract)
mlir.register_lowering(moe_backward_p, _lowering, platform="cuda")


def launch_kernel(dy, indices, weights, w1, w2, fws, x=None, hs=None, sw1=None, sw2=None, *, input_gating: bool,
                  cu_cap=None, movers=None, switching: bool = True):
  """The launch alone: (dx [t, h], dx_rows [R + S, h], pair_row [t, k], dw1, dw2, dsw1,
  dsw2), the last two the shared expert's when sw1 is given (with x, hs, sw2), else None."""
  if not _ext.has_target(TARGET, "cuda"):
    raise NotImplementedError(f"{TARGET} is not compiled into this extension (a CUDA build with the MoE "
                              "backward handler is needed)")
  runtime.init()
  shared = sw1 is not None
  none = jnp.zeros((1,), jnp.bfloat16)
  ops_ = (dy, indices.astype(jnp.int32), weights.astype(F32), w1, w2, fws) + (
      (x, hs, sw1, sw2) if shared else (none,) * 4)
  both = frozenset().union(*(_compat.vma(a) for a in ops_))
  ops_ = tuple(_compat.pvary_to(a, both) for a in ops_)
  dx, dx_rows, pair_row, dw1, dw2, dsw1, dsw2, _ = moe_backward_p.bind(
      *ops_, input_gating=int(bool(input_gating)), shared=int(bool(shared)), cu_cap=cu_cap, movers=movers,
      switching=int(bool(switching)))
  return dx, dx_rows, pair_row, dw1, dw2, (dsw1 if shared else None), (dsw2 if shared else None)


def moe_backward_fused(res, dy, daux, router_w, gate_up, down, shared_gate_up=None, shared_down=None, *,
                       config: MoEConfig, axis_name, cu_cap=None):
  """ops.moe_backward in one launch at EP = 1 (operands validated by ops.moe_backward),
  after a fused forward: (dx, drouter_w, dgate_up, ddown, dshared_gate_up, dshared_down)
  as reference.moe_backward returns them."""
  op = "moe_backward"
  check_fused(op, res, config, int(_compat.axis_size(axis_name)))
  x, routing = res.x, res.routing
  dt = x.dtype
  output_gated = config.gating == "output"
  shared = shared_gate_up is not None
  sw = (x, res.hs, ref._flat(shared_gate_up), shared_down) if shared else ()
  dxk, dx_rows, pair_row, dw1, dw2, dsgu, dsd = launch_kernel(
      dy.astype(dt), routing.indices, routing.weights, ref._flat(gate_up), down, res.ws, *sw,
      input_gating=not output_gated, cu_cap=cu_cap)
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
  return fwd.refusal(check_fused, "moe_backward", res, config, int(_compat.axis_size(axis_name)),
                     precision=precision)


register_fused("moe_backward", moe_backward_fused, auto=auto_rule)
