"""Pure-JAX twin of the MoE megakernels (paper §3.3): per device, inside shard_map.

Forward (§3.3.1): route -> plan -> dispatch -> GEMM1+SwiGLU -> GEMM2 -> combine -> fold
(+ shared expert). Backward (§3.3.2): dispatch of the router-weighted dY -> dgrad2
(SwiGLU backward fused) + wgrad2 -> dgrad1 + wgrad1 -> combine of dX -> routing-weight
gradients <dY, Y_j> + aux-loss gradient through the score function -> router
dX_r / dW_r -> fold of dX.

Buffers. XLA:CPU has no ragged all-to-all and ragged_dot is dense on GPU (DESIGN.md
§6), so rows travel in capacity-padded blocks: every rank sends each peer a
[E_local, C, hidden] block (C rows per (source rank, expert), `MoEConfig.capacity`)
through one `all_to_all`, and the receiver's rows are expert-major, source-minor:
[E_local, ep*C, hidden], the order the kernel's GEMM1 consumes them. Padding rows are
zero, so they add nothing to any GEMM or gradient.

Overflow policy (never drop silently). `plan` exchanges the per-expert counts (the
only cross-rank data before dispatch, as in the paper) and flags whether any
(source, expert) count exceeds C on any rank. If so, the expert part of this call runs
with dropless buffers (C = t_local: a token picks an expert at most once), selected by
a `lax.cond` on a flag that every rank agrees on; the paper likewise falls back to an
unfused layer beyond the capacity. The fallback saves no expert activations; its
backward recomputes them (rematerialization) so the residuals keep static shapes.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from kosmos_jax import _compat
from kosmos_jax.moe import router as rt
from kosmos_jax.moe.config import MoEConfig

F32 = jnp.float32


class Layout(NamedTuple):
  """Where each (token, slot) pair goes; pairs are numbered token-major (t*k + j)."""
  dest: jax.Array         # [t, k] int32 rank that owns the expert
  local_expert: jax.Array  # [t, k] int32 expert id on that rank
  pos: jax.Array          # [t, k] int32 row among this rank's rows for that expert (stable order)
  recv_counts: jax.Array  # [ep, E_local] int32 rows each source rank sends to each local expert
  overflow: jax.Array     # [] bool, identical on every rank: some count exceeds the capacity


def plan(indices, *, num_experts: int, capacity: int, axis_name) -> Layout:
  """Stable sort of the (token, slot) pairs into expert-major order + count exchange.

  The stable order (ties keep token-major order) is what keeps the expert GEMMs'
  row order, and so dW's accumulation order, reproducible. Computed with a stable
  argsort: the permutation a stable counting sort produces.
  """
  ep = _compat.axis_size(axis_name)
  e_local = num_experts // ep
  flat = indices.reshape(-1)                                    # [n = t*k]
  order = jnp.argsort(flat, stable=True)                        # expert-major, stable
  counts = jnp.zeros((num_experts,), jnp.int32).at[flat].add(1)  # [E]
  starts = jnp.cumsum(counts) - counts
  pos_sorted = jnp.arange(flat.shape[0], dtype=jnp.int32) - starts[flat[order]]
  pos = jnp.zeros_like(flat).at[order].set(pos_sorted).reshape(indices.shape)
  # Only per-expert counts cross ranks: recv[s, e] = rows source s sends to expert e here.
  recv = jax.lax.all_to_all(counts.reshape(ep, e_local), axis_name, 0, 0, tiled=True)
  over = jnp.any(recv > capacity).astype(jnp.int32)
  # Every rank (and every replica along other mesh axes) must take the same branch.
  axes = tuple(sorted(_compat.vma(over) | {axis_name})) if isinstance(axis_name, str) else axis_name
  over = jax.lax.pmax(over, axes) > 0
  return Layout(indices // e_local, indices % e_local, pos, recv, over)


def _send_index(layout: Layout, capacity: int, e_local: int, ep: int):
  """[ep*E_local*C] pair id feeding each send row (n = t*k marks padding), and the
  flat send row of each pair (out of range when it does not fit)."""
  n = layout.pos.size
  fits = layout.pos < capacity
  row = (layout.dest * e_local + layout.local_expert) * capacity + layout.pos  # [t, k]
  row = jnp.where(fits, row, ep * e_local * capacity).reshape(-1)
  src = jnp.full((ep * e_local * capacity,), n, jnp.int32)
  return src.at[row].set(jnp.arange(n, dtype=jnp.int32), mode="drop"), row


def dispatch(rows, layout: Layout, *, capacity: int, axis_name):
  """Send rows to their experts' owners. rows: [t, h] (each token to its k experts)
  or [t, k, h] (one row per pair). Returns [E_local, ep*C, h], expert-major."""
  ep = _compat.axis_size(axis_name)
  e_local = layout.recv_counts.shape[1]
  t, k = layout.pos.shape
  h = rows.shape[-1]
  pairs = jnp.broadcast_to(rows[:, None, :], (t, k, h)) if rows.ndim == 2 else rows
  padded = jnp.concatenate([pairs.reshape(t * k, h), jnp.zeros((1, h), rows.dtype)], axis=0)
  src, _ = _send_index(layout, capacity, e_local, ep)
  send = padded[src].reshape(ep, e_local * capacity, h)          # destination-major
  recv = jax.lax.all_to_all(send, axis_name, 0, 0, tiled=True)   # [src, E_local*C, h]
  recv = recv.reshape(ep, e_local, capacity, h).transpose(1, 0, 2, 3)
  return recv.reshape(e_local, ep * capacity, h)


def combine(expert_rows, layout: Layout, *, capacity: int, axis_name):
  """Return expert output rows [E_local, ep*C, h] to their token owners: [t, k, h]."""
  ep = _compat.axis_size(axis_name)
  e_local, _, h = expert_rows.shape
  back = expert_rows.reshape(e_local, ep, capacity, h).transpose(1, 0, 2, 3)
  back = jax.lax.all_to_all(back.reshape(ep, e_local * capacity, h), axis_name, 0, 0, tiled=True)
  _, row = _send_index(layout, capacity, e_local, ep)
  flat = jnp.concatenate([back.reshape(-1, h), jnp.zeros((1, h), back.dtype)], axis=0)
  return flat[row].reshape(*layout.pos.shape, h)


def fold(rows, weights):
  """Each token's k rows [t, k, h] weighted by fp32 weights [t, k] and summed in fp32,
  slot 0 first (fixed order: bitwise reproducible). Returns fp32 [t, h]."""
  acc = rows[:, 0].astype(F32) * weights[:, 0:1]
  for j in range(1, rows.shape[1]):
    acc = acc + rows[:, j].astype(F32) * weights[:, j:j + 1]
  return acc


def _swiglu(h1):
  """gate|up pre-activations [..., 2I] -> silu(gate) * up in fp32."""
  g, u = jnp.split(h1.astype(F32), 2, axis=-1)
  return jax.nn.silu(g) * u


def _swiglu_bwd(h1, da):
  """d(pre-activations) [..., 2I] fp32 from d(silu(g)*u) [..., I]."""
  g, u = jnp.split(h1.astype(F32), 2, axis=-1)
  sig = jax.nn.sigmoid(g)
  da = da.astype(F32)
  return jnp.concatenate([da * u * sig * (1 + g * (1 - sig)), da * g * sig], axis=-1)


def experts_forward(xr, w1, w2):
  """Grouped GEMM1 + SwiGLU epilogue, then GEMM2. xr [E_l, R, h], w1 [E_l, h, 2I],
  w2 [E_l, I, h] -> (pre-activations h1 [E_l, R, 2I], outputs [E_l, R, h])."""
  dt = xr.dtype
  h1 = jnp.einsum("erh,ehf->erf", xr, w1, preferred_element_type=F32).astype(dt)
  a = _swiglu(h1).astype(dt)
  return h1, jnp.einsum("eri,eih->erh", a, w2, preferred_element_type=F32).astype(dt)


def experts_backward(dyr, xr, h1, w1, w2):
  """dgrad2 with the SwiGLU backward fused, wgrad2, dgrad1, wgrad1 (all fp32 accumulation).
  dyr [E_l, R, h] router-weighted dY rows -> (dxr [E_l, R, h], dw1, dw2)."""
  dt = xr.dtype
  da = jnp.einsum("erh,eih->eri", dyr, w2, preferred_element_type=F32)
  dh1 = _swiglu_bwd(h1, da).astype(dt)
  dw2 = jnp.einsum("eri,erh->eih", _swiglu(h1).astype(dt), dyr, preferred_element_type=F32)
  dxr = jnp.einsum("erf,ehf->erh", dh1, w1, preferred_element_type=F32).astype(dt)
  dw1 = jnp.einsum("erh,erf->ehf", xr, dh1, preferred_element_type=F32)
  return dxr, dw1.astype(w1.dtype), dw2.astype(w2.dtype)


def shared_forward(x, sw1, sw2):
  """Always-on SwiGLU expert on the local tokens: (pre-activations, fp32 output)."""
  hs = jnp.einsum("th,hf->tf", x, sw1, preferred_element_type=F32).astype(x.dtype)
  return hs, jnp.einsum("ti,ih->th", _swiglu(hs).astype(x.dtype), sw2, preferred_element_type=F32)


def shared_backward(dy, x, hs, sw1, sw2):
  dt = x.dtype
  da = jnp.einsum("th,ih->ti", dy, sw2, preferred_element_type=F32)
  dhs = _swiglu_bwd(hs, da).astype(dt)
  dsw2 = jnp.einsum("ti,th->ih", _swiglu(hs).astype(dt), dy, preferred_element_type=F32)
  dx = jnp.einsum("tf,hf->th", dhs, sw1, preferred_element_type=F32)
  dsw1 = jnp.einsum("th,tf->hf", x, dhs, preferred_element_type=F32)
  return dx, dsw1.astype(sw1.dtype), dsw2.astype(sw2.dtype)


class MoEResiduals(NamedTuple):
  """What the forward keeps for the backward (the megakernel keeps the same)."""
  x: jax.Array             # [t, h] local tokens: router and shared-expert backward
  routing: rt.Routing      # indices, fp32 weights, fp32 logits, counts
  layout: Layout           # send layout and the overflow flag
  xr: jax.Array            # [E_l, ep*C, h] dispatched rows: wgrad1 (zeros after a fallback)
  h1: jax.Array            # [E_l, ep*C, 2I] GEMM1 pre-activations (zeros after a fallback)
  rows: jax.Array          # [t, k, h] expert outputs Y_j back at their owner: dw = <dY, Y_j>
  hs: jax.Array | None     # [t, 2*I_shared] shared-expert pre-activations


def _zeros_like_varying(shape, dtype, *like):
  """Zeros typed as varying over the mesh axes of `like` (lax.cond needs both
  branches to agree on that type)."""
  target = frozenset().union(*(_compat.vma(a) for a in like))
  return _compat.pvary_to(jnp.zeros(shape, dtype), target)


def _experts_fwd(x, layout, w1, w2, cap, axis_name):
  xr = dispatch(x, layout, capacity=cap, axis_name=axis_name)
  h1, yr = experts_forward(xr, w1, w2)
  return combine(yr, layout, capacity=cap, axis_name=axis_name), xr, h1


def moe_forward(x, router_w, w1, w2, shared_w1=None, shared_w2=None, bias=None, *,
                config: MoEConfig, axis_name):
  """Per-device MoE forward. x [t, h]; router_w [h, E]; w1 [E_l, h, 2I]; w2 [E_l, I, h];
  shared_w1 [h, 2I_s], shared_w2 [I_s, h] or None; bias [E] fp32 or None.
  Returns (y [t, h] in x.dtype, aux loss [] fp32 over the EP group, MoEResiduals)."""
  t = x.shape[0]
  cap = config.capacity(t)
  routing = rt.route(x, router_w, config, bias)
  aux = rt.aux_loss(routing, config, axis_name)
  layout = plan(routing.indices, num_experts=config.num_experts, capacity=cap, axis_name=axis_name)
  capped = lambda: _experts_fwd(x, layout, w1, w2, cap, axis_name)
  if cap >= t:  # statically dropless: nothing can overflow
    rows, xr, h1 = capped()
  else:
    def dropless():
      rows, xr, h1 = _experts_fwd(x, layout, w1, w2, t, axis_name)
      zr = _zeros_like_varying((w1.shape[0], xr.shape[1] // t * cap, x.shape[1]), x.dtype, xr)
      zh = _zeros_like_varying((w1.shape[0], zr.shape[1], w1.shape[2]), x.dtype, h1)
      return rows, zr, zh
    rows, xr, h1 = jax.lax.cond(layout.overflow, dropless, capped)
  y = fold(rows, routing.weights)
  hs = None
  if shared_w1 is not None:
    hs, ys = shared_forward(x, shared_w1, shared_w2)
    y = y + ys
  return y.astype(x.dtype), aux, MoEResiduals(x, routing, layout, xr, h1, rows, hs)


def _experts_bwd(dyw, x, xr, h1, layout, w1, w2, cap, axis_name, recompute):
  if recompute:  # the fallback saved no activations: rematerialize them at this capacity
    xr = dispatch(x, layout, capacity=cap, axis_name=axis_name)
    h1, _ = experts_forward(xr, w1, w2)
  dyr = dispatch(dyw, layout, capacity=cap, axis_name=axis_name)
  dxr, dw1, dw2 = experts_backward(dyr, xr, h1, w1, w2)
  return combine(dxr, layout, capacity=cap, axis_name=axis_name), dw1, dw2


def router_logit_grad(routing: rt.Routing, dw, daux, config: MoEConfig, axis_name):
  """dL/dlogits [t, E] fp32 from the combine-weight gradients dw [t, k] and the
  aux-loss cotangent daux [] (through P_i; f_i is a count, not differentiated)."""
  idx, logits = routing.indices, routing.logits
  _, vjp = jax.vjp(lambda z: rt.combine_weights(z, idx, config), logits)
  (dz,) = vjp(dw.astype(F32))
  if config.aux_loss_coeff:
    counts = jax.lax.psum(routing.counts.astype(F32), axis_name)
    t_all = jnp.float32(logits.shape[0] * _compat.axis_size(axis_name))
    f = counts / (t_all * config.top_k)
    dp = jnp.asarray(daux, F32) * jnp.float32(config.aux_loss_coeff * config.num_experts) * f / t_all
    _, vjp_p = jax.vjp(lambda z: rt.aux_probs(z, config), logits)
    (dz_aux,) = vjp_p(_compat.pvary_to(jnp.broadcast_to(dp[None, :], logits.shape),
                                        _compat.vma(logits)))
    dz = dz + dz_aux
  return dz


def moe_backward(res: MoEResiduals, dy, daux, router_w, w1, w2, shared_w1=None, shared_w2=None, *,
                 config: MoEConfig, axis_name):
  """Per-device MoE backward. dy [t, h]; daux [] cotangent of the aux loss.
  Returns (dx, drouter_w, dw1, dw2, dshared_w1, dshared_w2) — each partial over the
  ranks where its primal is replicated (the custom_vjp rule sums those)."""
  x, routing, layout = res.x, res.routing, res.layout
  t, dt = x.shape[0], x.dtype
  cap = config.capacity(t)
  dy32 = dy.astype(F32)
  dw = jnp.einsum("th,tkh->tk", dy32, res.rows.astype(F32))       # routing-weight grads
  dyw = (routing.weights[..., None] * dy32[:, None, :]).astype(dt)  # router-weighted dY rows
  capped = lambda: _experts_bwd(dyw, x, res.xr, res.h1, layout, w1, w2, cap, axis_name, False)
  if cap >= t:
    dx_rows, dw1, dw2 = capped()
  else:
    dropless = lambda: _experts_bwd(dyw, x, None, None, layout, w1, w2, t, axis_name, True)
    dx_rows, dw1, dw2 = jax.lax.cond(layout.overflow, dropless, capped)
  dz = router_logit_grad(routing, dw, daux, config, axis_name)
  dx = fold(dx_rows, jnp.ones(dx_rows.shape[:2], F32))
  dx = dx + jnp.einsum("te,he->th", dz, router_w.astype(F32))
  drouter = jnp.einsum("th,te->he", x.astype(F32), dz).astype(router_w.dtype)
  dsw1 = dsw2 = None
  if shared_w1 is not None:
    dxs, dsw1, dsw2 = shared_backward(dy, x, res.hs, shared_w1, shared_w2)
    dx = dx + dxs
  return dx.astype(dt), drouter, dw1, dw2, dsw1, dsw2
