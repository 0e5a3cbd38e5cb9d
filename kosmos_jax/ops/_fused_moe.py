"""Fused MoE forward behind kosmos_jax.ops.moe_forward: the `kosmos_moe_forward` FFI
target (csrc/moe_fwd_cuda.cu), one persistent launch that plans the (token, slot) pairs,
gathers their token rows into expert-major arena rows, and runs GEMM1 with its SwiGLU
epilogue, GEMM2, the shared expert's tiles and the fold (kernels/moe/fwd_sched.h).
At EP > 1 (the axis_name axis of a jax.shard_map over a concrete mesh, one host's
GPUs) the same launch on every rank pushes its rows into the owners' arenas and the
expert outputs back, through the ranks' symmetric heaps (kernels/moe/fwd_heap.h; its
size: KOSMOS_HEAP_MB, and the handler names what a call needs); the fused backward
(kosmos_jax/ops/_fused_moe_bwd.py) runs there too.
Any CUDA GPU: the expert GEMMs run on the Hopper tile engine on compute capability 9.0
and on the portable one elsewhere (and everywhere with KOSMOS_FUSED_BUILDERS=portable);
the handler counts which ran (kosmos_jax.testing.builder_runs()["moe_forward"]).

Before the launch, in XLA, exactly as the twin (kosmos_jax.reference.moe) computes them:
  - routing (router logits, top-k, combine weights) and the aux loss (moe_router), the
    top-k ids from the `kosmos_moe_select` kernel on XLA's scores (select_experts: the
    twin's ids, without the sorts XLA lowers jax.lax.top_k to);
  - the layout (reference.moe.plan): cheap, and the backward and routing_stats read it.
The shared expert runs in the launch, as row blocks of its own (x's token rows,
its own weights): its GEMM1 tiles start at once, while the movers gather the
routed rows; its output row joins each token's fold after the k routed rows (the
twin's order: fold, then + y_s, rounded once; y_s in bf16, as every expert's row),
and its bf16 pre-activations hs come back as the twin's residual. It must be as wide as a routed expert
(shared_expert_intermediate == expert_intermediate, as in every preset); other
widths run under impl='reference'.

The residuals are the twin's, less the dispatched rows (xr = h1 = None), plus the
launch's workspace ws: its gathered x rows (padding rows zero), SwiGLU activations and
routed pre-activations, in the arena's order, which the fused backward
(kosmos_jax/ops/_fused_moe_bwd.py) reads; the twin's backward ignores ws and recomputes
the expert rows by the dropless pass. A forward no backward reads (for_backward=False,
moe_layer outside a gradient) launches with keep_preacts = 0 (GEMM1's epilogue stores h
alone) and keeps only x, routing and layout.

No capacity: the kernel's arena holds every pair a rank can receive (R rows below), so
it never falls back and never drops. The layout, and so routing_stats' capacity_fill and
dropless_fallback, still say what the twin's capped buffers would have done with this
routing.

The FFI contract (kosmos_moe_forward, platform CUDA):
  operands  x [t, h] bf16; indices [t, k] int32 (Routing.indices); weights [t, k] f32
            (Routing.weights); w1 [E_l, h, 2I] bf16 (this rank's gate_up, gate then up,
            a free reshape); w2 [E_l, I, h] bf16 (down); sw1 [h, 2I] and sw2 [I, h] bf16, the
            shared expert's, when shared = 1, else (1,) bf16 arrays the kernel ignores.
  attrs     (int64) input_gating: 1 for MoEConfig.gating == "input" (each dispatched
            row scaled by its weight and rounded to bf16, as the twin's
            _expert_inputs, then folded with weight 1); shared; cu_cap (0: no cap;
            the grid is min(SMs, cu_cap)); movers (-1: the kernel's rule); switching
            (1 by default; 0: a fixed mover crew); keep_preacts (1: GEMM1's pre-activations
            kept for the backward, routed in ws and the shared expert's in hs; 0: none,
            a forward no backward reads); groups (the mesh's EP groups of global device
            ids), ep, slots (their control slots), as the TP+SP ops.
  results   y [t, h] bf16; y_rows [R + S + P, h] bf16, every pair's expert output row
            in arena order, then the shared expert's S = shared_rows(t) (token order),
            then at EP > 1 the P = return_rows rows our pairs got back from their owners;
            pair_row [t, k] int32, the row of y_rows holding pair (token, slot);
            hs [t, 2I] bf16, the shared expert's pre-activations (shared = keep_preacts
            = 1, else (1,)); ws [W] uint8 (arena_rows, workspace_bytes; no h1 region
            with keep_preacts = 0): scratch, and
            the fused backward's residual.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from kosmos_jax import _compat, _ext, runtime
from kosmos_jax.kernel_config import MoeLaunch
from kosmos_jax.ops._dispatch import register_fused
from kosmos_jax.ops._fused_tp import group_attrs
from kosmos_jax.reference import moe as ref
from kosmos_jax.reference import moe_router as rt
from kosmos_jax.reference.moe_config import MoEConfig

TARGET = "kosmos_moe_forward"
# kernels/moe: rows per GEMM row block (each expert's arena segment is padded to it),
# tokens per plan/fold block, and the most experts route.h handles.
TILE_ROWS = 128
BLOCK_TOKENS = 128
MAX_EXPERTS = 512
MAX_EP = 8  # kernels/moe/fwd_layout.h kEpMaxRanks: an EP group is the GPUs of one host
MAX_TOP_K = 32  # the fold's warp holds one token's k rows (and the shared expert's: 31 then)
# The Hopper engine's k-blocks of h (GEMM1's contraction, GEMM2's column blocks) and
# the SwiGLU pairs of GEMM1's column blocks (gate and up halves of one tile). The
# portable engine (every other GPU, or KOSMOS_FUSED_BUILDERS=portable) needs less
# (h % 8, I % 64); one rule for both, so a model that runs fused on one GPU runs on all.
HIDDEN_MULTIPLE = 64
INTERMEDIATE_MULTIPLE = 128
CTRL_BYTES = 65536  # the workspace's control block: flags, counters, layout
ALIGN = 1024        # every workspace region starts on a 1 KiB boundary


def _roundup(n: int, m: int) -> int:
  return -(-n // m) * m


def arena_rows(t: int, k: int, e: int, ep: int = 1) -> int:
  """R, a rank's arena rows: dropless, every pair any of the ep sources can send it a
  row (a token picks an expert at most once, so t * min(k, E_l) per source, E_l = e /
  ep) and each of the E_l expert segments padded up to TILE_ROWS (at most TILE_ROWS - 1
  rows each), rounded to a whole row block."""
  el = e // ep
  return _roundup(ep * t * min(k, el) + el * (TILE_ROWS - 1), TILE_ROWS)


def return_rows(t: int, k: int, e: int, ep: int = 1) -> int:
  """P, the rows our pairs come back in at EP > 1 (every pair of ours: t * min(k, E)),
  copied into y_rows after its R + S rows; 0 at EP = 1."""
  return t * min(k, e) if ep > 1 else 0


def shared_rows(t: int, shared: bool) -> int:
  """S, the shared expert's rows of y_rows (and of the SwiGLU activations): t in whole
  row blocks, or 0 without a shared expert."""
  return _roundup(t, TILE_ROWS) if shared else 0


def workspace_bytes(t: int, k: int, e: int, h: int, i: int, shared: bool, ep: int = 1,
                    keep_preacts: bool = True) -> int:
  """W, the scratch bytes of one launch; the C++ handler refuses a smaller ws, naming
  both sizes. In order: the control block; 32 bytes of flags per row block; the plan's
  per-(token block, expert) counts; each arena row's pair; the gathered token rows
  (bf16 [R, h], padding rows zero; EP = 1 only: at EP > 1 the arena is in the heap);
  the SwiGLU activations (bf16 [R + S, I]); the routed rows' pre-activations (bf16
  [R, 2I], gate | up; none with keep_preacts=False). The last three are what a
  backward over the same routing reuses (kernels/moe/fwd_ws.h)."""
  r, s, nb = arena_rows(t, k, e, ep), shared_rows(t, shared), -(-t // BLOCK_TOKENS)
  al = lambda n: _roundup(n, ALIGN)
  return (al(CTRL_BYTES) + al((r + s) // TILE_ROWS * 32) + al(nb * e * 4) + al(r * 4)
          + (al(r * h * 2) if ep == 1 else 0) + al((r + s) * i * 2) + (al(r * 2 * i * 2) if keep_preacts else 0))


def check_fused(op: str, x, config: MoEConfig, ep: int) -> None:
  """What the fused forward runs, refused before lowering with the values named."""
  if ep > MAX_EP:
    raise ValueError(f"{op} (fused): the axis_name axis has size {ep}; the fused MoE forward's EP group is "
                     f"at most {MAX_EP} GPUs of one host (impl='reference' runs any size)")
  if jnp.dtype(x.dtype) != jnp.dtype(jnp.bfloat16):
    raise ValueError(f"{op} (fused): x.dtype={jnp.dtype(x.dtype)} is not supported; the fused MoE "
                     "forward runs bfloat16 only (impl='reference' runs any float dtype)")
  h, i, e = config.hidden, config.expert_intermediate, config.num_experts
  if h % HIDDEN_MULTIPLE or i % INTERMEDIATE_MULTIPLE or e > MAX_EXPERTS:
    raise ValueError(f"{op} (fused): hidden={h} must be a multiple of {HIDDEN_MULTIPLE}, "
                     f"expert_intermediate={i} a multiple of {INTERMEDIATE_MULTIPLE}, and "
                     f"num_experts={e} at most {MAX_EXPERTS} (impl='reference' runs any shape)")
  si = config.shared_expert_intermediate
  if si and si != i:
    raise ValueError(f"{op} (fused): shared_expert_intermediate={si} must equal expert_intermediate={i} (the "
                     "launch runs the shared expert as row blocks of the routed GEMMs; impl='reference' runs "
                     "any width)")
  most = MAX_TOP_K - (1 if si else 0)
  if config.top_k > most:
    raise ValueError(f"{op} (fused): top_k={config.top_k} must be at most {most} (a warp of the fold holds one "
                     "token's rows, the shared expert's too; impl='reference' runs any top_k)")


moe_forward_p = Primitive(TARGET)
moe_forward_p.multiple_results = True


def _abstract(x, indices, weights, w1, w2, sw1, sw2, *, input_gating, shared, cu_cap, movers, switching,
              keep_preacts, axis_name, ep):
  # Every result typed like x (dtype aside): the operands were given one varying-axes
  # type, the union of theirs, before the bind.
  t, h = x.shape
  k, (el, _, two_i) = indices.shape[1], w1.shape
  e = el * ep
  r, s, p = arena_rows(t, k, e, ep), shared_rows(t, shared), return_rows(t, k, e, ep)
  return (x.update(shape=(t, h)), x.update(shape=(r + s + p, h)),
          x.update(shape=(t, k), dtype=jnp.dtype(jnp.int32)),
          x.update(shape=(t, two_i) if shared and keep_preacts else (1,)),
          x.update(shape=(workspace_bytes(t, k, e, h, two_i // 2, shared, ep, keep_preacts),),
                   dtype=jnp.dtype(jnp.uint8)))


def _lowering(ctx, x, indices, weights, w1, w2, sw1, sw2, *, input_gating, shared, cu_cap, movers, switching,
              keep_preacts, axis_name, ep):
  # The EP groups of the mesh (jax.shard_map's), as the TP+SP ops take theirs; none at EP = 1.
  none = np.zeros((0,), np.int64)
  groups = group_attrs(TARGET, ctx, axis_name, ep) if ep > 1 else dict(groups=none, slots=none)
  return jax.ffi.ffi_lowering(TARGET)(
      ctx, x, indices, weights, w1, w2, sw1, sw2, input_gating=np.int64(input_gating), shared=np.int64(shared),
      cu_cap=np.int64(cu_cap or 0), movers=np.int64(-1 if movers is None else movers),
      switching=np.int64(switching), keep_preacts=np.int64(keep_preacts), ep=np.int64(ep), **groups)


moe_forward_p.def_abstract_eval(_abstract)
mlir.register_lowering(moe_forward_p, _lowering, platform="cuda")


def launch_kernel(x, indices, weights, w1, w2, sw1=None, sw2=None, *, input_gating: bool, cu_cap=None,
                  launch: MoeLaunch = MoeLaunch(), axis_name=None, keep_preacts: bool = True):
  """The launch alone, on routing made elsewhere: (y [t, h], y_rows [R + S, h],
  pair_row [t, k], hs [t, 2I] or None); sw1 [h, 2I] and sw2 [I, h] bf16, the shared
  expert's weights, or None (no shared expert); keep_preacts=False: no pre-activations
  kept (hs None). The tests reach it through kosmos_jax.testing.moe_forward_kernel."""
  return _launch(x, indices, weights, w1, w2, sw1, sw2, input_gating=input_gating, cu_cap=cu_cap,
                 launch=launch, axis_name=axis_name, keep_preacts=keep_preacts)[:4]


def _launch(x, indices, weights, w1, w2, sw1, sw2, *, input_gating: bool, cu_cap, launch: MoeLaunch,
            axis_name=None, keep_preacts: bool = True):
  """launch_kernel's four results and the workspace ws (the fused backward's residual)."""
  if not _ext.has_target(TARGET, "cuda"):
    raise NotImplementedError(f"{TARGET} is not compiled into this extension (a CUDA build with the "
                              "MoE forward handler is needed)")
  if (sw1 is None) != (sw2 is None):
    raise ValueError(f"{TARGET}: the shared expert needs both sw1 and sw2 (got sw1 "
                     f"{None if sw1 is None else sw1.shape}, sw2 {None if sw2 is None else sw2.shape})")
  runtime.init()  # trace time: every persistent kernel is prepared before any runs
  shared = sw1 is not None
  none = jnp.zeros((1,), jnp.bfloat16)
  ops_ = (x, indices.astype(jnp.int32), weights.astype(jnp.float32), w1, w2, sw1 if shared else none,
          sw2 if shared else none)
  both = frozenset().union(*(_compat.vma(a) for a in ops_))
  ops_ = tuple(_compat.pvary_to(a, both) for a in ops_)
  # Bound directly (as the TP+SP ops are): inside shard_map even an eager call runs
  # each primitive under jit, so it needs no impl rule of its own.
  ep = 1 if axis_name is None else int(_compat.axis_size(axis_name))
  y, y_rows, pair_row, hs, ws = moe_forward_p.bind(
      *ops_, input_gating=int(bool(input_gating)), shared=int(shared), cu_cap=cu_cap, movers=launch.movers,
      switching=int(launch.switching), keep_preacts=int(bool(keep_preacts)), axis_name=axis_name if ep > 1 else None,
      ep=ep)
  return y, y_rows, pair_row, hs if shared and keep_preacts else None, ws


SELECT = "kosmos_moe_select"
moe_select_p = Primitive(SELECT)
moe_select_p.def_abstract_eval(lambda score, bias, *, top_k, n_groups, topk_groups, has_bias: score.update(
    shape=(score.shape[0], top_k), dtype=jnp.dtype(jnp.int32)))
mlir.register_lowering(
    moe_select_p, lambda ctx, score, bias, **attrs: jax.ffi.ffi_lowering(SELECT)(
        ctx, score, bias, **{k: np.int64(v) for k, v in attrs.items()}), platform="cuda")


def pick_experts(score, *, top_k: int, n_groups: int, topk_groups: int, bias=None):
  """moe_router.pick's ids [t, k] int32 (its twin) from one small kernel
  (kernels/moe/select.cuh) on the scores [t, E] fp32."""
  if not _ext.has_target(SELECT, "cuda"):
    raise NotImplementedError(f"{SELECT} is not compiled into this extension (a CUDA build is needed)")
  b = jnp.zeros((1,), jnp.float32) if bias is None else bias.astype(jnp.float32)
  both = _compat.vma(score) | _compat.vma(b)
  score, b = _compat.pvary_to(score, both), _compat.pvary_to(b, both)
  return moe_select_p.bind(score, b, top_k=top_k, n_groups=n_groups, topk_groups=topk_groups,
                           has_bias=int(bias is not None))


def select_experts(logits, config: MoEConfig, bias=None):
  """moe_router.select's ids through pick_experts' kernel on XLA's scores: XLA lowers
  jax.lax.top_k to sorts (Qwen3-30B-A3B's 8192 tokens: 29 us, DeepSeek-V3's three:
  181 us)."""
  return pick_experts(rt.scores(logits, config), top_k=config.top_k, n_groups=config.n_groups,
                      topk_groups=config.topk_groups, bias=bias)


def xla_part(x, router_w, bias=None, *, config: MoEConfig, axis_name):
  """What the fused forward still runs before its launch: the routing (XLA ops, its top-k
  ids from select_experts' kernel) and the aux loss, (routing, aux). benchmarks/moe.py
  times it alone (arm xla_part), so the cost of not fusing the router is measured."""
  routing = rt.route(x, router_w, config, bias, selector=select_experts)
  return routing, rt.aux_loss(routing, config, axis_name)


def moe_forward_fused(x, router_w, gate_up, down, shared_gate_up=None, shared_down=None, bias=None, *,
                      config: MoEConfig, axis_name, cu_cap=None, launch: MoeLaunch = MoeLaunch(),
                      for_backward: bool = True):
  """ops.moe_forward in one launch (operands validated by ops.moe_forward): (y [t, h]
  bf16, aux loss [] fp32, MoEResiduals), as reference.moe_forward returns them, the
  residuals without dispatched rows (xr = h1 = None), with the launch's workspace.
  for_backward=False: the launch keeps no pre-activations (GEMM1's epilogue stores h
  alone); ops.moe_forward then trims the residuals (and XLA drops what they lose)."""
  op = "moe_forward"
  ep = int(_compat.axis_size(axis_name))
  check_fused(op, x, config, ep)
  routing, aux = xla_part(x, router_w, bias, config=config, axis_name=axis_name)
  layout = ref.plan(routing.indices, num_experts=config.num_experts, capacity=config.capacity(x.shape[0]),
                    axis_name=axis_name)
  output_gated = config.gating == "output"
  sw1 = None if shared_gate_up is None else ref._flat(shared_gate_up)
  y, y_rows, pair_row, hs, ws = _launch(x, routing.indices, routing.weights, ref._flat(gate_up), down, sw1,
                                        shared_down, input_gating=not output_gated, cu_cap=cu_cap, launch=launch,
                                        axis_name=axis_name, keep_preacts=for_backward)
  # The backward's dg_j = <dY, Y_j> reads each pair's expert output (output gating only).
  rows = y_rows[pair_row] if output_gated else None
  return y, aux, ref.MoEResiduals(x, routing, layout, None, None, rows, hs, ws)


# `auto` runs the fused forward (and after it the fused backward) where it was measured
# faster than the reference layer: 1xH200, EP = 1, bf16, 8192 tokens (benchmarks/RESULTS.md,
# MoE). DeepSeek-V3, Qwen3-235B-A22B, Qwen3-30B-A3B and Llama 4 Scout route 256-512 pairs
# to an expert: forward 1.29-1.68x, training step 1.21-1.74x. Llama 4 Maverick routes 64
# (each 128-row block half padding): 0.93x and 0.88x. Hence the Hopper builders, and at
# least one row block of pairs per expert on average.
AUTO_MIN_PAIRS_PER_EXPERT = TILE_ROWS


def hopper_builders_here() -> bool:
  """Whether the launches would build with their Hopper builders: every local GPU of
  compute capability 9.0, and no KOSMOS_FUSED_BUILDERS=portable."""
  if os.environ.get("KOSMOS_FUSED_BUILDERS") == "portable":
    return False
  gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
  return bool(gpus) and all(getattr(d, "compute_capability", "") == "9.0" for d in gpus)


def refusal(check, *args, precision=None) -> str:
  """Why a fused MoE kernel does not take a call ('' where it does): a precision, or
  what check(*args), the op's check_fused, raises."""
  if precision is not None:
    return f"precision={precision!r} asks for the twin (the fused kernel has one precision of its own)"
  try:
    check(*args)
  except (ValueError, NotImplementedError) as e:
    return str(e)
  return ""


def auto_rule(x, *_, config: MoEConfig, axis_name, precision=None) -> str:
  """'' where `auto` runs the fused forward, else why the twin stays (the op's call:
  ops.moe_forward's arrays, config, axis_name and precision)."""
  why = refusal(check_fused, "moe_forward", x, config, int(_compat.axis_size(axis_name)), precision=precision)
  if why:
    return why
  if int(_compat.axis_size(axis_name)) > 1:
    return ("at EP > 1 the fused MoE layer has been run only as loopback ranks on one GPU, never measured across "
            "GPUs against the reference layer (issue 29); impl='fused' runs it")
  if not hopper_builders_here():
    return "the fused MoE layer was measured faster only with its Hopper builders (compute capability 9.0)"
  t, k, e = x.shape[0], config.top_k, config.num_experts
  if t * k < AUTO_MIN_PAIRS_PER_EXPERT * e:
    return (f"{t=} tokens x top_k={k} route {t * k / e:g} pairs to each of num_experts={e} on average, under "
            f"one {TILE_ROWS}-row block, where the fused layer was measured slower (Llama 4 Maverick)")
  return ""


register_fused("moe_forward", moe_forward_fused, auto=auto_rule)
