"""Pure-JAX twin of the MoE megakernels (paper §3.3): per device, inside shard_map.

Forward (§3.3.1): route -> plan -> dispatch -> GEMM1+SwiGLU -> GEMM2 -> combine -> fold
(+ shared expert). Backward (§3.3.2): dispatch of dY -> dgrad2 (SwiGLU backward fused)
+ wgrad2 -> dgrad1 + wgrad1 -> combine of dX -> routing-weight gradients -> router
dX_r / dW_r -> fold of dX.

Gating (`MoEConfig.gating`). 'output': a pair's combine weight g scales the expert's
output, so the rows sent are x and the router-weighted dY. 'input' (Llama 4): g scales
the expert's input, so the rows sent are g * x and the unweighted dY, and the outputs
fold with weight 1.

Capped buffers. XLA:CPU has no ragged all-to-all and ragged_dot is dense on GPU
(DESIGN.md §6), so rows travel in capacity-padded blocks: every rank sends each peer a
[E_local, C, hidden] block (C rows per (source rank, expert), `MoEConfig.capacity`)
through one `all_to_all`, and the receiver's rows are expert-major, source-minor:
[E_local, ep*C, hidden], the order the kernel's GEMM1 consumes them. Padding rows are
zero, so they add nothing to any GEMM or gradient.

Dropless pass (never drop silently). `plan` exchanges the per-expert counts (the only
cross-rank data before dispatch, as in the paper) and flags whether any
(source, expert) count exceeds C on any rank. If so, the expert part of this call runs
the dropless pass instead, selected by a `lax.cond` on a flag every rank agrees on (the
paper likewise falls back to an unfused layer beyond the capacity); with
`capacity_factor=None`, or a capacity of t_local, it is the only pass. Its buffers hold
pairs, not experts x tokens rows: each rank sends each peer one block of
S = t_local * min(k, E_local) rows (the most one token batch can route to one rank),
and the receiver packs what arrived expert-major, then runs each expert's GEMMs over
its own rows in tiles of `TILE_ROWS` (a loop: the rows per expert are data, the shapes
are not). The pass saves no expert activations; its backward recomputes them, so the
residuals keep static shapes.

Residuals without dispatched rows. `MoEResiduals.xr` (and `h1`) may be None: the
dropless pass saves none, and neither does the fused forward (ops.moe_forward with
impl='fused', kosmos_jax/ops/_fused_moe.py), whose rows live in the kernel's scratch.
The backward then recomputes the expert activations through the dropless pass, as it
does after a dropless forward, whatever `layout.overflow` says. So the layer's
backward under impl='fused' is this twin, run on the fused forward's residuals.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from kosmos_jax import _compat
from kosmos_jax.reference import moe_router as rt
from kosmos_jax.reference.moe_config import MoEConfig

F32 = jnp.float32
# Rows per expert GEMM tile in the dropless pass (at most; fewer for small batches).
# A tile wastes at most TILE_ROWS - 1 rows per expert; larger tiles run fewer loop steps.
TILE_ROWS = 256


class Layout(NamedTuple):
  """Where each (token, slot) pair goes; pairs are numbered token-major (t*k + j)."""
  dest: jax.Array         # [t, k] int32 rank that owns the expert
  local_expert: jax.Array  # [t, k] int32 expert id on that rank
  pos: jax.Array          # [t, k] int32 row among this rank's rows for that expert (stable order)
  send_counts: jax.Array  # [E] int32 rows this rank sends to each expert
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
  return Layout(indices // e_local, indices % e_local, pos, counts, recv, over)


def _pairs(rows, layout: Layout):
  """[t*k + 1, h]: one row per pair (rows [t, h] repeat per slot; [t, k, h] as given),
  then one zero row that every padding slot reads."""
  t, k = layout.pos.shape
  h = rows.shape[-1]
  pairs = jnp.broadcast_to(rows[:, None, :], (t, k, h)) if rows.ndim == 2 else rows
  return jnp.concatenate([pairs.reshape(t * k, h), jnp.zeros((1, h), rows.dtype)], axis=0)


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
  h = rows.shape[-1]
  src, _ = _send_index(layout, capacity, e_local, ep)
  send = _pairs(rows, layout)[src].reshape(ep, e_local * capacity, h)  # destination-major
  recv = jax.lax.all_to_all(send, axis_name, 0, 0, tiled=True)         # [src, E_local*C, h]
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


# ---- the dropless pass: pairs packed expert-major, tiled expert GEMMs ------------

class Packing(NamedTuple):
  """Where the dropless pass puts each pair. Send blocks hold S rows per destination
  (destination-major); the receiver packs its ep*S received rows expert-major,
  source-minor, padding last."""
  send_row: jax.Array      # [t*k] int32 row of each pair in the [ep*S] send buffer
  order: jax.Array         # [ep*S] int32 received row feeding each packed row
  unorder: jax.Array       # [ep*S] int32 packed row of each received row
  expert_start: jax.Array  # [E_local] int32 first packed row of each local expert
  expert_rows: jax.Array   # [E_local] int32 packed rows of each local expert


def block_rows(t: int, k: int, e_local: int) -> int:
  """S: the most rows t tokens can route to one rank (a token picks an expert once)."""
  return t * min(k, e_local)


def tile_rows(total: int, e_local: int) -> int:
  """Rows per expert tile: about the mean rows per expert, a power of 2 in [8, TILE_ROWS]."""
  mean = max(1, -(-total // e_local))
  return min(TILE_ROWS, max(8, 1 << (mean - 1).bit_length()))


def pack(layout: Layout, *, axis_name) -> Packing:
  """The dropless pass's send rows and receive packing, from the plan's counts."""
  ep = _compat.axis_size(axis_name)
  t, k = layout.pos.shape
  e_local = layout.recv_counts.shape[1]
  s = block_rows(t, k, e_local)
  sent = layout.send_counts.reshape(ep, e_local)
  before = (jnp.cumsum(sent, axis=1) - sent).reshape(-1)  # rows for lower experts, same rank
  expert = layout.dest * e_local + layout.local_expert
  send_row = (layout.dest * s + before[expert] + layout.pos).reshape(-1)
  # Source s's block holds its rows for local expert 0, then 1, ...; rows past the
  # last count are padding, marked e_local so that they sort last.
  ends = jnp.cumsum(layout.recv_counts, axis=1)
  r = jnp.arange(s, dtype=jnp.int32)
  local = jax.vmap(lambda c: jnp.searchsorted(c, r, side="right"))(ends).reshape(-1)
  order = jnp.argsort(local, stable=True).astype(jnp.int32)
  unorder = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=jnp.int32))
  rows = jnp.sum(layout.recv_counts, axis=0).astype(jnp.int32)
  return Packing(send_row.astype(jnp.int32), order, unorder, jnp.cumsum(rows) - rows, rows)


def dispatch_packed(rows, layout: Layout, pk: Packing, *, axis_name):
  """Send rows ([t, h] or [t, k, h], as `dispatch`) for the dropless pass. Returns the
  packed rows [ep*S + tile, h]: expert-major, then zero rows, so that a tile starting
  at any expert's first row stays in bounds."""
  n = layout.pos.size
  total, e_local = pk.order.shape[0], pk.expert_rows.shape[0]
  src = jnp.full((total,), n, jnp.int32).at[pk.send_row].set(jnp.arange(n, dtype=jnp.int32))
  recv = jax.lax.all_to_all(_pairs(rows, layout)[src], axis_name, 0, 0, tiled=True)
  pad = jnp.zeros((tile_rows(total, e_local), rows.shape[-1]), rows.dtype)
  return jnp.concatenate([recv[pk.order], pad], axis=0)


def combine_packed(packed, layout: Layout, pk: Packing, *, axis_name):
  """Return packed expert rows [ep*S (+ tile), h] to their token owners: [t, k, h]."""
  back = packed[:pk.order.shape[0]][pk.unorder]
  back = jax.lax.all_to_all(back, axis_name, 0, 0, tiled=True)
  return back[pk.send_row].reshape(*layout.pos.shape, packed.shape[-1])


def packed_experts_forward(xp, w1, w2, pk: Packing, precision=None):
  """Each local expert's SwiGLU over its own packed rows, tile by tile: xp [R, h]
  packed rows; w1 [E_l, h, 2I] gate|up; w2 [E_l, I, h]. Returns outputs [R, h]
  (rows of no expert are zero)."""
  b = tile_rows(pk.order.shape[0], w1.shape[0])

  def expert(out, per):
    wg, wd, start, rows = per

    def tile(j, out):
      at = start + j * b
      _, y = experts_forward(jax.lax.dynamic_slice_in_dim(xp, at, b)[None], wg[None], wd[None],
                             precision)
      keep = (jnp.arange(b) < rows - j * b)[:, None]  # the tile's tail is the next expert's
      y = jnp.where(keep, y[0], jax.lax.dynamic_slice_in_dim(out, at, b))
      return jax.lax.dynamic_update_slice_in_dim(out, y, at, 0)

    return jax.lax.fori_loop(0, (rows + b - 1) // b, tile, out), None

  out0 = _zeros_like_varying(xp.shape, xp.dtype, xp, w1, w2)
  # A scan over the experts slices their weights as it goes (no copy of the stack).
  return jax.lax.scan(expert, out0, (w1, w2, pk.expert_start, pk.expert_rows))[0]


def packed_experts_backward(xp, dyp, w1, w2, pk: Packing, precision=None):
  """Backward of `packed_experts_forward` (recomputing GEMM1 per tile): dyp [R, h] the
  packed output gradients. Returns (dxp [R, h], dw1, dw2); each expert's weight
  gradient is summed in fp32 over its tiles and rounded once."""
  b = tile_rows(pk.order.shape[0], w1.shape[0])
  like = (xp, dyp, w1, w2)

  def expert(dxp, per):
    wg, wd, start, rows = per
    wg, wd = wg[None], wd[None]

    def tile(j, c):
      dxp, a1, a2 = c
      at = start + j * b
      keep = (jnp.arange(b) < rows - j * b)[:, None]
      xs = jax.lax.dynamic_slice_in_dim(xp, at, b)[None]
      # Another expert's gradient rows must not reach this expert's weights.
      dys = jnp.where(keep, jax.lax.dynamic_slice_in_dim(dyp, at, b), 0)[None]
      h1, _ = experts_forward(xs, wg, wd, precision)
      dxs, g1, g2 = _expert_grads(dys, xs, h1, wg, wd, precision)
      dxs = jnp.where(keep, dxs[0], jax.lax.dynamic_slice_in_dim(dxp, at, b))
      return jax.lax.dynamic_update_slice_in_dim(dxp, dxs, at, 0), a1 + g1[0], a2 + g2[0]

    acc = (_zeros_like_varying(wg.shape[1:], F32, *like), _zeros_like_varying(wd.shape[1:], F32, *like))
    dxp, a1, a2 = jax.lax.fori_loop(0, (rows + b - 1) // b, tile, (dxp, *acc))
    return dxp, (a1.astype(w1.dtype), a2.astype(w2.dtype))

  dxp0 = _zeros_like_varying(xp.shape, xp.dtype, *like)
  # The scan stacks each expert's weight gradient into its output as it goes.
  dxp, (dw1, dw2) = jax.lax.scan(expert, dxp0, (w1, w2, pk.expert_start, pk.expert_rows))
  return dxp, dw1, dw2


# ---- expert math ---------------------------------------------------------------

def _swiglu(h1):
  """gate|up pre-activations [..., 2I] -> silu(gate) * up in fp32."""
  g, u = jnp.split(h1.astype(F32), 2, axis=-1)
  return jax.nn.silu(g) * u


def swiglu_backward(h1, da):
  """d(pre-activations) [..., 2I] fp32 from d(silu(g)*u) [..., I] (dgrad2's epilogue;
  also the check of the backward floor's kosmos_grouped_swiglu_bwd)."""
  g, u = jnp.split(h1.astype(F32), 2, axis=-1)
  sig = jax.nn.sigmoid(g)
  da = da.astype(F32)
  return jnp.concatenate([da * u * sig * (1 + g * (1 - sig)), da * g * sig], axis=-1)


def _flat(gate_up):
  """gate_up [..., h, 2, I] -> [..., h, 2I] (gate columns, then up: a free reshape)."""
  return gate_up.reshape(*gate_up.shape[:-2], -1)


def experts_forward(xr, w1, w2, precision=None):
  """Grouped GEMM1 + SwiGLU epilogue, then GEMM2. xr [E_l, R, h], w1 [E_l, h, 2I]
  (gate|up flattened), w2 [E_l, I, h] -> (pre-activations h1 [E_l, R, 2I], outputs [E_l, R, h])."""
  dt = xr.dtype
  h1 = jnp.einsum("erh,ehf->erf", xr, w1, preferred_element_type=F32, precision=precision).astype(dt)
  a = _swiglu(h1).astype(dt)
  return h1, jnp.einsum("eri,eih->erh", a, w2, preferred_element_type=F32,
                        precision=precision).astype(dt)


def _expert_grads(dyr, xr, h1, w1, w2, precision):
  """(dxr in xr.dtype, dw1 fp32, dw2 fp32): dgrad2 with the SwiGLU backward fused,
  wgrad2, dgrad1, wgrad1, all accumulated in fp32."""
  dt = xr.dtype
  da = jnp.einsum("erh,eih->eri", dyr, w2, preferred_element_type=F32, precision=precision)
  dh1 = swiglu_backward(h1, da).astype(dt)
  dw2 = jnp.einsum("eri,erh->eih", _swiglu(h1).astype(dt), dyr, preferred_element_type=F32,
                   precision=precision)
  dxr = jnp.einsum("erf,ehf->erh", dh1, w1, preferred_element_type=F32, precision=precision)
  dw1 = jnp.einsum("erh,erf->ehf", xr, dh1, preferred_element_type=F32, precision=precision)
  return dxr.astype(dt), dw1, dw2


def experts_backward(dyr, xr, h1, w1, w2, precision=None):
  """dyr [E_l, R, h] output-row gradients -> (dxr [E_l, R, h], dw1, dw2) in the weights' dtype."""
  dxr, dw1, dw2 = _expert_grads(dyr, xr, h1, w1, w2, precision)
  return dxr, dw1.astype(w1.dtype), dw2.astype(w2.dtype)


def shared_forward(x, sw1, sw2, precision=None):
  """Always-on SwiGLU expert on the local tokens (sw1 [h, 2I_s] flattened gate|up):
  (pre-activations, output), both in x.dtype: its output rows are rounded as every
  routed expert's are, and the layer folds them in fp32 after the routed rows (the
  megakernel's fold adds the shared expert's row as one more slot of weight 1)."""
  hs = jnp.einsum("th,hf->tf", x, sw1, preferred_element_type=F32, precision=precision).astype(x.dtype)
  return hs, jnp.einsum("ti,ih->th", _swiglu(hs).astype(x.dtype), sw2, preferred_element_type=F32,
                        precision=precision).astype(x.dtype)


def shared_backward(dy, x, hs, sw1, sw2, precision=None):
  """(dx fp32, dsw1, dsw2) of `shared_forward`."""
  dt = x.dtype
  da = jnp.einsum("th,ih->ti", dy, sw2, preferred_element_type=F32, precision=precision)
  dhs = swiglu_backward(hs, da).astype(dt)
  dsw2 = jnp.einsum("ti,th->ih", _swiglu(hs).astype(dt), dy, preferred_element_type=F32,
                    precision=precision)
  dx = jnp.einsum("tf,hf->th", dhs, sw1, preferred_element_type=F32, precision=precision)
  dsw1 = jnp.einsum("th,tf->hf", x, dhs, preferred_element_type=F32, precision=precision)
  return dx, dsw1.astype(sw1.dtype), dsw2.astype(sw2.dtype)


# ---- the layer -----------------------------------------------------------------

class MoEResiduals(NamedTuple):
  """What the forward keeps for the backward (the megakernel keeps the same, except
  that the fused forward saves no dispatched rows: xr = h1 = None, and the backward
  recomputes them by the dropless pass)."""
  x: jax.Array             # [t, h] local tokens: router and shared-expert backward
  routing: rt.Routing      # indices, fp32 weights, fp32 logits, counts
  layout: Layout           # send layout and the overflow flag
  xr: jax.Array | None     # [E_l, ep*C, h] dispatched rows: wgrad1 (zeros after a fallback;
                           # None where the dropless pass is the only one, and after the
                           # fused forward: the backward then recomputes them)
  h1: jax.Array | None     # [E_l, ep*C, 2I] GEMM1 pre-activations (None exactly when xr is)
  rows: jax.Array | None   # [t, k, h] expert outputs Y_j at their owner, for dg = <dY, Y_j>
                           # (output gating; None for input gating)
  hs: jax.Array | None     # [t, 2*I_shared] shared-expert pre-activations
  ws: jax.Array | None = None  # the fused forward's workspace (its gathered rows, activations and
                               # pre-activations, kernels/moe/fwd_ws.h), which the fused backward
                               # reads; None from the twin, and ignored by it


class RoutingStats(NamedTuple):
  """Per-step routing statistics over the EP group's tokens, for a trainer to log."""
  expert_counts: jax.Array      # [E] int32 (token, slot) pairs routed to each expert
  max_load: jax.Array           # [] fp32 largest count / mean count (1.0 = balanced)
  capacity_fill: jax.Array      # [] fp32 most rows one (source, expert) sent / capacity
  dropless_fallback: jax.Array  # [] bool the capped buffers overflowed: the dropless pass ran


def _zeros_like_varying(shape, dtype, *like):
  """Zeros typed as varying over the mesh axes of `like` (lax.cond and loop carries
  need their branches / steps to agree on that type)."""
  target = frozenset().union(*(_compat.vma(a) for a in like))
  return _compat.pvary_to(jnp.zeros(shape, dtype), target)


def _agree(tree, *like):
  """Mark every leaf of `tree` varying over the union of the axes of `like`."""
  target = frozenset().union(*(_compat.vma(a) for a in jax.tree.leaves(like)))
  return jax.tree.map(lambda a: _compat.pvary_to(a, target), tree)


def _expert_inputs(x, weights, config: MoEConfig):
  """The rows the experts see: x for every slot, or g_j * x per pair (input gating)."""
  if config.gating == "input":
    return (weights[..., None] * x.astype(F32)[:, None, :]).astype(x.dtype)
  return x


def _capped_fwd(rows, layout, w1, w2, cap, axis_name, precision):
  xr = dispatch(rows, layout, capacity=cap, axis_name=axis_name)
  h1, yr = experts_forward(xr, w1, w2, precision)
  return combine(yr, layout, capacity=cap, axis_name=axis_name), xr, h1


def _dropless_fwd(rows, layout, w1, w2, axis_name, precision):
  pk = pack(layout, axis_name=axis_name)
  xp = dispatch_packed(rows, layout, pk, axis_name=axis_name)
  yp = packed_experts_forward(xp, w1, w2, pk, precision)
  return combine_packed(yp, layout, pk, axis_name=axis_name)


def _experts_fwd(x, routing, layout, w1, w2, config, axis_name, precision):
  """Expert rows back at their owner [t, k, h], plus the capped residuals (xr, h1)."""
  t = x.shape[0]
  cap = config.capacity(t)
  rows = _expert_inputs(x, routing.weights, config)
  if cap >= t:  # statically dropless: the packed pass is the smaller one
    return _dropless_fwd(rows, layout, w1, w2, axis_name, precision), None, None
  like = (rows, w1, w2)

  def fallback():
    ep, e_l = layout.recv_counts.shape
    zr = jnp.zeros((e_l, ep * cap, x.shape[1]), x.dtype)
    zh = jnp.zeros((e_l, ep * cap, w1.shape[2]), x.dtype)
    return _agree((_dropless_fwd(rows, layout, w1, w2, axis_name, precision), zr, zh), *like)

  capped = lambda: _agree(_capped_fwd(rows, layout, w1, w2, cap, axis_name, precision), *like)
  return jax.lax.cond(layout.overflow, fallback, capped)


def moe_forward(x, router_w, gate_up, down, shared_gate_up=None, shared_down=None, bias=None, *,
                config: MoEConfig, axis_name, precision=None):
  """Per-device MoE forward. x [t, h]; router_w [h, E]; gate_up [E_l, h, 2, I];
  down [E_l, I, h]; shared_gate_up [h, 2, I_s], shared_down [I_s, h] or None; bias [E]
  fp32 or None; precision: of every dot (jax.lax.Precision), None = JAX's default.
  Returns (y [t, h] in x.dtype, aux loss [] fp32 over the EP group, MoEResiduals)."""
  routing = rt.route(x, router_w, config, bias, precision=precision)
  aux = rt.aux_loss(routing, config, axis_name)
  layout = plan(routing.indices, num_experts=config.num_experts, capacity=config.capacity(x.shape[0]),
                axis_name=axis_name)
  rows, xr, h1 = _experts_fwd(x, routing, layout, _flat(gate_up), down, config, axis_name, precision)
  output_gated = config.gating == "output"
  y = fold(rows, routing.weights if output_gated else jnp.ones(rows.shape[:2], F32))
  hs = None
  if shared_gate_up is not None:
    hs, ys = shared_forward(x, _flat(shared_gate_up), shared_down, precision)
    y = y + ys.astype(F32)
  res = MoEResiduals(x, routing, layout, xr, h1, rows if output_gated else None, hs)
  return y.astype(x.dtype), aux, res


def _capped_bwd(dy_rows, xr, h1, layout, w1, w2, cap, axis_name, precision):
  dyr = dispatch(dy_rows, layout, capacity=cap, axis_name=axis_name)
  dxr, dw1, dw2 = experts_backward(dyr, xr, h1, w1, w2, precision)
  return combine(dxr, layout, capacity=cap, axis_name=axis_name), dw1, dw2


def _dropless_bwd(rows, dy_rows, layout, w1, w2, axis_name, precision):
  """The dropless pass saved nothing: dispatch the inputs again and recompute."""
  pk = pack(layout, axis_name=axis_name)
  xp = dispatch_packed(rows, layout, pk, axis_name=axis_name)
  dyp = dispatch_packed(dy_rows, layout, pk, axis_name=axis_name)
  dxp, dw1, dw2 = packed_experts_backward(xp, dyp, w1, w2, pk, precision)
  return combine_packed(dxp, layout, pk, axis_name=axis_name), dw1, dw2


def _experts_bwd(res: MoEResiduals, dy_rows, w1, w2, config, axis_name, precision):
  """(d expert-input rows [t, k, h], dw1 [E_l, h, 2I], dw2) by the pass the forward took,
  or by the dropless pass where the forward saved no rows (res.xr is None)."""
  x, layout = res.x, res.layout
  t = x.shape[0]
  cap = config.capacity(t)
  rows = lambda: _expert_inputs(x, res.routing.weights, config)
  dropless = lambda: _dropless_bwd(rows(), dy_rows, layout, w1, w2, axis_name, precision)
  if cap >= t or res.xr is None:  # nothing saved (dropless or fused forward): recompute
    return dropless()
  like = (x, dy_rows, w1, w2)
  capped = lambda: _capped_bwd(dy_rows, res.xr, res.h1, layout, w1, w2, cap, axis_name, precision)
  return jax.lax.cond(layout.overflow, lambda: _agree(dropless(), *like),
                      lambda: _agree(capped(), *like))


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


def moe_backward(res: MoEResiduals, dy, daux, router_w, gate_up, down, shared_gate_up=None,
                 shared_down=None, *, config: MoEConfig, axis_name, precision=None):
  """Per-device MoE backward. dy [t, h]; daux [] cotangent of the aux loss.
  Returns (dx, drouter_w, dgate_up, ddown, dshared_gate_up, dshared_down) — each
  partial over the ranks where its primal is replicated (the custom_vjp rule sums those)."""
  x, routing = res.x, res.routing
  dt = x.dtype
  dy32 = dy.astype(F32)
  output_gated = config.gating == "output"
  if output_gated:  # y = sum_j g_j Y_j: dg_j = <dY, Y_j>, and expert j sees g_j dY
    dw = jnp.einsum("th,tkh->tk", dy32, res.rows.astype(F32), precision=precision)
    dy_rows = (routing.weights[..., None] * dy32[:, None, :]).astype(dt)
  else:  # y = sum_j E_j(g_j x): every expert sees dY itself
    dy_rows = dy
  d_rows, dw1, dw2 = _experts_bwd(res, dy_rows, _flat(gate_up), down, config, axis_name, precision)
  if output_gated:
    dx = fold(d_rows, jnp.ones(d_rows.shape[:2], F32))
  else:  # d(g_j x) = d_rows_j: dg_j = <d_rows_j, x>, dx = sum_j g_j d_rows_j
    dw = jnp.einsum("th,tkh->tk", x.astype(F32), d_rows.astype(F32), precision=precision)
    dx = fold(d_rows, routing.weights)
  dz = router_logit_grad(routing, dw, daux, config, axis_name)
  dx = dx + jnp.einsum("te,he->th", dz, router_w.astype(F32), precision=precision)
  drouter = jnp.einsum("th,te->he", x.astype(F32), dz, precision=precision).astype(router_w.dtype)
  dsgu = dsd = None
  if shared_gate_up is not None:
    dxs, dsgu, dsd = shared_backward(dy, x, res.hs, _flat(shared_gate_up), shared_down, precision)
    dx, dsgu = dx + dxs, dsgu.reshape(shared_gate_up.shape)
  return dx.astype(dt), drouter, dw1.reshape(gate_up.shape), dw2, dsgu, dsd


def routing_stats(res: MoEResiduals, config: MoEConfig, axis_name) -> RoutingStats:
  """This step's RoutingStats over the tokens of the EP group `axis_name`."""
  counts = jax.lax.psum(res.routing.counts, axis_name)
  most = jax.lax.pmax(jnp.max(res.layout.recv_counts), axis_name)
  fill = most.astype(F32) / jnp.float32(config.capacity(res.x.shape[0]))
  return RoutingStats(counts, _max_load(counts), fill, res.layout.overflow)


def _max_load(counts):
  total = jnp.maximum(jnp.sum(counts), 1).astype(F32)
  return jnp.max(counts).astype(F32) * jnp.float32(counts.shape[0]) / total


def reduce_stats(stats: RoutingStats, axis_name: str) -> RoutingStats:
  """Stats over the tokens of every replica along `axis_name` (e.g. the dp axis):
  counts summed, fill and fallback maxed, where they differ along that axis."""
  def over(a, reduce):
    return reduce(a, axis_name) if axis_name in _compat.vma(a) else a

  counts = over(stats.expert_counts, jax.lax.psum)
  fill = over(stats.capacity_fill, jax.lax.pmax)
  fell = over(stats.dropless_fallback.astype(jnp.int32), jax.lax.pmax) > 0
  return RoutingStats(counts, _max_load(counts), fill, fell)
