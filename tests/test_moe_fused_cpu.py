"""The fused MoE forward's and backward's Python side on CPU (kosmos_jax/ops/_fused_moe.py,
_fused_moe_bwd.py): their checks
raise before lowering; the workspace formula; the primitive's abstract shapes and the
custom call it lowers to for CUDA; the whole wrapper (routing, shared expert, residuals)
with a pure-JAX twin of the kernel's contract standing in for the primitive, forward
and jax.grad through the layer; and the twin's backward from residuals without
dispatched rows (what the fused forward saves) against the one from the saved rows.
The kernel itself runs on GPU only (tests/gpu/test_moe_fused.py). Kernel-less set-up:
kosmos_jax.testing.fused_on_cpu; ops reached through their public names."""
from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from helpers import assert_close, fresh, put
from kosmos_jax import AgConfig, MoeLaunch, ops, reference
from kosmos_jax.moe import MoEConfig, moe_layer, route
from kosmos_jax.reference import moe as ref_moe
from kosmos_jax.testing import (fake_fused, fused_on_cpu, fused_ops, moe_arena_rows, moe_backward_workspace_bytes,
                                moe_forward_kernel, moe_return_rows, moe_shared_rows, moe_workspace_bytes, MOE_TILE_ROWS)
from moe_oracle import NAMES, SPECS, dense_moe, ep_mesh, layer_grads, make_params, place, to_f32

BF16 = jnp.bfloat16
T = 64
# Every preset's router kind at kernel-legal widths (h % 64, I % 128).
SOFTMAX = MoEConfig(num_experts=8, top_k=2, hidden=64, expert_intermediate=128, score="softmax",
                    norm_topk_prob=True, aux_loss_coeff=0.01)
DEEPSEEK = MoEConfig(num_experts=16, top_k=4, hidden=64, expert_intermediate=128, score="sigmoid",
                     norm_topk_prob=True, n_groups=4, topk_groups=2, route_scale=2.5, use_expert_bias=True,
                     aux_loss_coeff=0.01, shared_expert_intermediate=128)
LLAMA4 = MoEConfig(num_experts=8, top_k=1, hidden=64, expert_intermediate=128, score="sigmoid",
                   gating="input", shared_expert_intermediate=128)
KINDS = {"softmax": SOFTMAX, "deepseek": DEEPSEEK, "llama4": LLAMA4}


class _KernelTwin:
  """kosmos_moe_forward's contract in JAX: pairs placed expert-major in a stable
  order, each expert's segment padded to 128 rows, then the shared expert's rows in
  token order; each pair's expert output; the fold (slot order, fp32, then the shared
  expert's row), rounded once."""

  def __init__(self):
    self.kept = []  # keep_preacts of each bind, in order

  def bind(self, x, indices, weights, w1, w2, sw1, sw2, *, input_gating, shared, cu_cap, movers, switching,
           keep_preacts, axis_name, ep):
    assert ep == 1 and axis_name is None, "the twin is the EP = 1 contract"
    self.kept.append(keep_preacts)
    t, k = indices.shape
    e, h = w1.shape[0], x.shape[1]
    flat = indices.reshape(-1)
    counts = jnp.zeros((e,), jnp.int32).at[flat].add(1)
    padded = -(-counts // MOE_TILE_ROWS) * MOE_TILE_ROWS
    order = jnp.argsort(flat, stable=True)
    starts = jnp.cumsum(counts) - counts
    pos = jnp.zeros_like(flat).at[order].set(jnp.arange(flat.shape[0], dtype=jnp.int32) - starts[flat[order]])
    pair_row = (jnp.cumsum(padded) - padded)[flat] + pos
    rows = ((weights[..., None] * x.astype(jnp.float32)[:, None, :]).astype(x.dtype) if input_gating
            else jnp.broadcast_to(x[:, None, :], (t, k, h))).reshape(t * k, h)
    _, out = ref_moe.experts_forward(jnp.broadcast_to(rows, (e, t * k, h)), w1, w2)
    out = out[flat, jnp.arange(t * k)]  # each pair through its own expert
    r, s = moe_arena_rows(t, k, e), moe_shared_rows(t, shared)
    y_rows = jnp.zeros((r + s, h), x.dtype).at[pair_row].set(out)
    y = ref_moe.fold(out.reshape(t, k, h), jnp.ones_like(weights) if input_gating else weights)
    hs = jnp.zeros((1,), x.dtype)
    if shared:
      hs, ys = ref_moe.shared_forward(x, sw1, sw2)
      y = y + ys.astype(jnp.float32)
      y_rows = y_rows.at[r:r + t].set(ys)
      hs = hs if keep_preacts else jnp.zeros((1,), x.dtype)
    ws = jnp.zeros((moe_workspace_bytes(t, k, e, h, w2.shape[1], shared, 1, bool(keep_preacts)),), jnp.uint8)
    return y.astype(x.dtype), y_rows, pair_row.reshape(t, k).astype(jnp.int32), hs, ws


@pytest.fixture
def no_gpu_needed():
  with fused_on_cpu():
    yield


@pytest.fixture
def kernel_twin():
  with fused_on_cpu({"moe_forward": _KernelTwin()}):
    yield


def _names(p):
  return tuple(n for n in NAMES if n in p)


def _forward(cfg, ep, impl, launch=None):
  """Jitted (x, *params) -> (y, aux, residuals' rows and routing) of ops.moe_forward."""
  names = _names(make_params(cfg, BF16, bool(cfg.shared_expert_intermediate)))

  def local(x, *ps):
    p = dict(zip(names, ps))
    y, aux, res = ops.moe_forward(x, p["router_w"], p["gate_up"], p["down"], p.get("shared_gate_up"),
                                  p.get("shared_down"), p.get("expert_bias"), config=cfg, axis_name="ep",
                                  impl=impl, launch=launch)
    rows = res.rows if res.rows is not None else jnp.zeros((x.shape[0], 1, 1), x.dtype)
    return y, aux, rows, res.routing.indices, res.layout.pos, res.xr is None

  m = ep_mesh(ep)
  f = jax.shard_map(local, mesh=m, in_specs=(P("ep"), *[SPECS[n] for n in names]),
                    out_specs=(P("ep"), P(), P("ep"), P("ep"), P("ep"), P()))
  return jax.jit(f), m


def test_moe_forward_is_registered():
  assert "moe_forward" in fused_ops()


# ---- checks before lowering ------------------------------------------------------

def _abstract_call(cfg, ep, dtype=BF16, launch=None, impl="fused"):
  """Trace ops.moe_forward on abstract inputs (no arrays, no lowering)."""
  p = make_params(cfg, jnp.float32, bool(cfg.shared_expert_intermediate))
  names = _names(p)
  f, _ = _forward(cfg, ep, impl, launch)
  structs = [jax.ShapeDtypeStruct((T, cfg.hidden), dtype)]
  structs += [jax.ShapeDtypeStruct(p[n].shape, jnp.float32 if n == "expert_bias" else dtype) for n in names]
  return jax.eval_shape(f, *structs)


def test_ep2_traces_with_the_returned_rows(no_gpu_needed):
  """At EP > 1 the launch is the same primitive over the EP group: y keeps its shape."""
  out = _abstract_call(SOFTMAX, 2)
  assert out[0].shape == (T, SOFTMAX.hidden), out


def test_fused_sizes_at_ep_above_one():
  """A rank's arena holds every pair any source can send it (t * min(k, E_l) each);
  the returned rows every pair of ours; the workspace drops the arena (heap-resident)."""
  assert moe_arena_rows(256, 4, 16, 8) == -(-(8 * 256 * 2 + 2 * 127) // 128) * 128
  assert moe_arena_rows(384, 4, 16, 1) == moe_arena_rows(384, 4, 16)
  assert moe_return_rows(256, 4, 16, 1) == 0 and moe_return_rows(256, 4, 16, 2) == 1024
  al = lambda n: -(-n // 1024) * 1024  # kernels/moe/fwd_ws.h: whole KiB sections
  t, k, e, h, i = 256, 4, 16, 256, 128
  sections = lambda r, arena: (al(r // 128 * 32) + al(r * 4) + (al(r * h * 2) if arena else 0) + al(r * i * 2)
                               + al(r * 2 * i * 2))
  r1, r2 = moe_arena_rows(t, k, e, 1), moe_arena_rows(t, k, e, 2)
  assert (moe_workspace_bytes(t, k, e, h, i, False, 1) - moe_workspace_bytes(t, k, e, h, i, False, 2)
          == sections(r1, True) - sections(r2, False))


@pytest.mark.parametrize("change,match", [
    (dict(dtype=jnp.float32), r"x.dtype=float32 is not supported; the fused MoE forward runs bfloat16 only"),
    (dict(expert_intermediate=96), r"expert_intermediate=96 a multiple of 128"),
    (dict(hidden=48), r"hidden=48 must be a multiple of 64"),
    (dict(num_experts=520, top_k=2), r"num_experts=520 at most 512"),
    (dict(num_experts=64, top_k=33), r"top_k=33 must be at most 32"),
], ids=["dtype", "intermediate", "hidden", "experts", "top_k"])
def test_kernel_limits_raise_before_lowering(no_gpu_needed, change, match):
  dtype = change.pop("dtype", BF16)
  with pytest.raises(ValueError, match=match):
    _abstract_call(SOFTMAX.replace(**change), 1, dtype)


@pytest.mark.parametrize("change,match", [
    (dict(shared_expert_intermediate=256), r"shared_expert_intermediate=256 must equal expert_intermediate=128"),
    (dict(num_experts=64, top_k=32), r"top_k=32 must be at most 31 \(a warp of the fold holds one token's rows, "
                                     r"the shared expert's too"),
], ids=["shared_width", "top_k_with_shared"])
def test_shared_expert_limits_raise_before_lowering(no_gpu_needed, change, match):
  with pytest.raises(ValueError, match=match):
    _abstract_call(DEEPSEEK.replace(n_groups=1, topk_groups=1, **change), 1)


def test_any_gpu_generation_traces_fused(no_gpu_needed, monkeypatch):
  """No compute-capability gate before lowering: the kernel has portable builders
  beside the Hopper ones (the handler picks per device), so a host of other GPUs
  traces the fused forward as a Hopper host does."""
  class _Gpu:
    platform = "gpu"

    def __init__(self, cc):
      self.compute_capability = cc

  monkeypatch.setattr(jax, "local_devices", lambda *a, **k: [_Gpu("8.0"), _Gpu("12.0"), _Gpu("9.0")])
  out = _abstract_call(SOFTMAX, 1)
  assert out[0].shape == (T, SOFTMAX.hidden)


def test_reference_path_takes_no_kernel_limits():
  """The same shapes run on the twin: the limits are the kernel's only."""
  out = _abstract_call(SOFTMAX.replace(hidden=48, expert_intermediate=96), 2, jnp.float32, impl="reference")
  assert out[0].shape == (T, 48)


def test_launch_knobs_are_checked():
  with pytest.raises(ValueError, match=r"MoeLaunch: movers=0 must be an int >= 1 or None"):
    MoeLaunch(movers=0)
  with pytest.raises(ValueError, match=r"MoeLaunch: switching=1 must be a bool"):
    MoeLaunch(switching=1)
  with pytest.raises(TypeError, match=r"moe_forward: launch=\{'movers': 2\} must be of type MoeLaunch"):
    _abstract_call(SOFTMAX, 1, jnp.float32, launch={"movers": 2}, impl="reference")
  with pytest.raises(TypeError, match=r"moe_layer: launch=AgConfig\(.*must be of type MoeLaunch"):
    moe_layer(jnp.zeros((8, 64)), make_params(SOFTMAX, jnp.float32, False), SOFTMAX, axis_name="ep",
              launch=AgConfig())


def test_reference_path_ignores_launch_knobs():
  cfg = SOFTMAX
  p = make_params(cfg, jnp.float32, False)
  x = fresh((T, cfg.hidden))
  outs = []
  for launch in (None, MoeLaunch(movers=3, switching=False)):
    f, m = _forward(cfg, 2, "reference", launch)
    _, xs, ps = place(m, x, p)
    outs.append(f(xs, *ps)[0])
  np.testing.assert_array_equal(np.asarray(outs[0]), np.asarray(outs[1]))


# ---- the workspace and the primitive's shapes ---------------------------------------

def test_workspace_formula():
  al = lambda n: -(-n // 1024) * 1024
  # DeepSeek-V3 at 8192 tokens: R = 8192 * 8 + 256 * 127 = 98048 (a multiple of 128).
  r = moe_arena_rows(8192, 8, 256)
  assert r == 98048
  # The last section: the routed pre-activations h1 [R, 2I] (the backward's residual).
  assert moe_workspace_bytes(8192, 8, 256, 7168, 2048, False) == (
      65536 + al(98048 // 128 * 32) + al(64 * 256 * 4) + al(98048 * 4) + al(98048 * 7168 * 2) + al(98048 * 2048 * 2)
      + al(98048 * 4096 * 2))
  # With its shared expert: S = 8192 more rows of flags and activations.
  assert moe_shared_rows(8192, True) == 8192 and moe_shared_rows(8192, False) == 0
  assert moe_workspace_bytes(8192, 8, 256, 7168, 2048, True) == (
      65536 + al(106240 // 128 * 32) + al(64 * 256 * 4) + al(98048 * 4) + al(98048 * 7168 * 2)
      + al(106240 * 2048 * 2) + al(98048 * 4096 * 2))
  # Tiny: R = roundup(5 * 2 + 8 * 127, 128) = 1152; one token block; S = 128.
  assert moe_arena_rows(5, 2, 8) == 1152
  assert moe_workspace_bytes(5, 2, 8, 64, 128, False) == 65536 + 1024 + 1024 + 5120 + 147456 + 294912 + 589824
  assert moe_shared_rows(5, True) == 128
  assert moe_workspace_bytes(5, 2, 8, 64, 128, True) == 65536 + 1024 + 1024 + 5120 + 147456 + 327680 + 589824
  # A launch that keeps no pre-activations has no h1 region (inference: DeepSeek-V3 766 MiB less).
  assert moe_workspace_bytes(5, 2, 8, 64, 128, True, 1, False) == 65536 + 1024 + 1024 + 5120 + 147456 + 327680
  assert (moe_workspace_bytes(8192, 8, 256, 7168, 2048, True) - moe_workspace_bytes(8192, 8, 256, 7168, 2048, True, 1,
                                                                                     False)) == al(98048 * 4096 * 2)
  # k > E: a token picks an expert at most once, so t * min(k, E) pairs.
  assert moe_arena_rows(3, 4, 2) == -(-(3 * 2 + 2 * 127) // 128) * 128


@pytest.mark.parametrize("t,k,e,h,i,shared", [(37, 2, 8, 64, 128, False), (300, 4, 16, 128, 256, True)])
def test_abstract_eval_shapes(no_gpu_needed, t, k, e, h, i, shared):
  args = (jax.ShapeDtypeStruct((t, h), BF16), jax.ShapeDtypeStruct((t, k), jnp.int32),
          jax.ShapeDtypeStruct((t, k), jnp.float32), jax.ShapeDtypeStruct((e, h, 2 * i), BF16),
          jax.ShapeDtypeStruct((e, i, h), BF16),
          jax.ShapeDtypeStruct((h, 2 * i), BF16) if shared else None,
          jax.ShapeDtypeStruct((i, h), BF16) if shared else None)
  fn = functools.partial(moe_forward_kernel, input_gating=False, cu_cap=3)
  y, y_rows, pair_row, hs = jax.eval_shape(fn, *args)
  r = moe_arena_rows(t, k, e) + moe_shared_rows(t, shared)
  assert (y.shape, y.dtype) == ((t, h), BF16)
  assert (y_rows.shape, y_rows.dtype) == ((r, h), BF16)
  assert (pair_row.shape, pair_row.dtype) == ((t, k), jnp.int32)
  assert (hs.shape, hs.dtype) == ((t, 2 * i), BF16) if shared else hs is None
  # The scratch result, read from the primitive's equation.
  eqn = [q for q in jax.make_jaxpr(fn)(*args).eqns if q.primitive.name == "kosmos_moe_forward"]
  assert len(eqn) == 1
  ws = eqn[0].outvars[4].aval
  assert ws.shape == (moe_workspace_bytes(t, k, e, h, i, shared),) and ws.dtype == jnp.uint8
  assert eqn[0].invars[5].aval.shape == ((h, 2 * i) if shared else (1,))
  assert eqn[0].invars[6].aval.shape == ((i, h) if shared else (1,))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_lowers_to_one_custom_call(no_gpu_needed, kind):
  cfg = KINDS[kind]
  shared = bool(cfg.shared_expert_intermediate)
  p = make_params(cfg, BF16, shared)
  f, m = _forward(cfg, 1, "fused", MoeLaunch(movers=5, switching=False))
  _, xs, ps = place(m, fresh((T, cfg.hidden), BF16), p)
  text = f.trace(xs, *ps).lower(lowering_platforms=("cuda",)).as_text()
  calls = [line for line in text.splitlines() if "custom_call @kosmos_moe_forward" in line]
  assert len(calls) == 1, text[-3000:]
  call = calls[0]
  e, h, i, k = cfg.num_experts, cfg.hidden, cfg.expert_intermediate, cfg.top_k
  r = moe_arena_rows(T, k, e) + moe_shared_rows(T, shared)
  sw1, sw2, hs = (f"{h}x{2 * i}xbf16", f"{i}x{h}xbf16", f"{T}x{2 * i}xbf16") if shared else ("1xbf16",) * 3
  assert (f"tensor<{T}x{h}xbf16>, tensor<{T}x{k}xi32>, tensor<{T}x{k}xf32>, tensor<{e}x{h}x{2 * i}xbf16>, "
          f"tensor<{e}x{i}x{h}xbf16>, tensor<{sw1}>, tensor<{sw2}>)") in call, call
  w = moe_workspace_bytes(T, k, e, h, i, shared)
  assert (f"-> (tensor<{T}x{h}xbf16>, tensor<{r}x{h}xbf16>, tensor<{T}x{k}xi32>, tensor<{hs}>, "
          f"tensor<{w}xui8>)") in call, call
  for attr in (f"input_gating = {int(cfg.gating == 'input')} : i64", f"shared = {int(shared)} : i64",
               "cu_cap = 0 : i64", "movers = 5 : i64", "switching = 0 : i64"):
    assert attr in call, (attr, call)
  # The routing's ids: the selection kernel on the scores, no XLA top-k left.
  sel = [line for line in text.splitlines() if "custom_call @kosmos_moe_select" in line]
  assert len(sel) == 1, text[-3000:]
  e_bias = e if cfg.use_expert_bias else 1
  assert f"(tensor<{T}x{e}xf32>, tensor<{e_bias}xf32>) -> tensor<{T}x{k}xi32>" in sel[0], sel[0]
  for attr in (f"top_k = {k} : i64", f"n_groups = {cfg.n_groups} : i64",
               f"topk_groups = {cfg.topk_groups} : i64", f"has_bias = {int(cfg.use_expert_bias)} : i64"):
    assert attr in sel[0], (attr, sel[0])
  assert "chlo.top_k" not in text, "the routing still runs XLA's top-k"


def test_default_knobs_lower_as_the_kernels_rules(no_gpu_needed):
  f, m = _forward(SOFTMAX, 1, "fused")
  _, xs, ps = place(m, fresh((T, SOFTMAX.hidden), BF16), make_params(SOFTMAX, BF16, False))
  call = [line for line in f.trace(xs, *ps).lower(lowering_platforms=("cuda",)).as_text().splitlines()
          if "custom_call @kosmos_moe_forward" in line][0]
  assert "movers = -1 : i64" in call and "switching = 1 : i64" in call and "cu_cap = 0 : i64" in call


# ---- the wrapper around a twin of the kernel ------------------------------------

@pytest.mark.parametrize("kind", sorted(KINDS))
def test_wrapper_matches_the_twin(kernel_twin, kind):
  cfg = KINDS[kind]
  shared = bool(cfg.shared_expert_intermediate)
  p = make_params(cfg, BF16, shared)
  x = fresh((T, cfg.hidden), BF16)
  outs = {}
  for impl in ("fused", "reference"):
    f, m = _forward(cfg, 1, impl)
    _, xs, ps = place(m, x, p)
    outs[impl] = f(xs, *ps)
  (y, aux, rows, idx, pos, no_xr), (yr, auxr, rowsr, idxr, posr, _) = outs["fused"], outs["reference"]
  assert bool(no_xr), "the fused forward saves no dispatched rows"
  assert_close(y, yr, BF16, what=f"{kind} y fused (kernel twin) vs reference")
  np.testing.assert_array_equal(np.asarray(aux), np.asarray(auxr))
  np.testing.assert_array_equal(np.asarray(idx), np.asarray(idxr))
  np.testing.assert_array_equal(np.asarray(pos), np.asarray(posr))
  if cfg.gating == "output":
    assert_close(rows, rowsr, BF16, what=f"{kind} residual rows")
  yd, _ = dense_moe(jnp.asarray(x, jnp.float32), to_f32(p), cfg)
  assert_close(y, yd, BF16, what=f"{kind} y fused (kernel twin) vs dense oracle")


@pytest.mark.parametrize("kind", ["deepseek", "softmax"])
def test_layer_keeps_preacts_only_under_a_gradient(no_gpu_needed, kind):
  """moe_layer outside a gradient lowers its launch with keep_preacts = 0 (no backward
  reads residuals; with a shared expert, hs is then a (1,) result), and jax.grad's
  forward with keep_preacts = 1."""
  cfg = KINDS[kind]
  p = make_params(cfg, BF16, bool(cfg.shared_expert_intermediate))
  names, m = _names(p), ep_mesh(1)
  _, xs, ps = place(m, fresh((T, cfg.hidden), BF16), p)

  def fwd(x, *ps_):
    return moe_layer(x, dict(zip(names, ps_)), cfg, axis_name="ep", impl="fused")[0]

  grad = jax.grad(lambda x, *ps_: jnp.sum(fwd(x, *ps_).astype(jnp.float32)))
  hs = f"tensor<{T}x{2 * cfg.expert_intermediate}xbf16>"
  shared, e, h, i = bool(cfg.shared_expert_intermediate), cfg.num_experts, cfg.hidden, cfg.expert_intermediate
  for fn, keep in ((fwd, 0), (grad, 1)):
    f = jax.jit(jax.shard_map(fn, mesh=m, in_specs=(P("ep"), *[SPECS[n] for n in names]), out_specs=P("ep")))
    text = f.trace(xs, *ps).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "custom_call @kosmos_moe_forward(" in line]
    assert len(calls) == 1 and f"keep_preacts = {keep} : i64" in calls[0], calls
    # The workspace result: no h1 region without a backward to read it.
    ws = f"tensor<{moe_workspace_bytes(T, cfg.top_k, e, h, i, shared, 1, bool(keep))}xui8>"
    assert ws in calls[0].split("->")[1], (ws, calls[0])
    if cfg.shared_expert_intermediate:
      assert (hs in calls[0].split("->")[1]) == bool(keep), calls[0]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_forward_only_residuals(kind):
  """ops.moe_forward(for_backward=False): the same y and aux as the default, the
  residuals trimmed to x, routing and layout on both paths, and moe_backward refuses
  them by name; the flag itself must be a bool."""
  cfg = KINDS[kind]
  twin = _KernelTwin()
  p = make_params(cfg, BF16, bool(cfg.shared_expert_intermediate))
  names, m = _names(p), ep_mesh(1)
  _, xs, ps = place(m, fresh((T, cfg.hidden), BF16), p)

  def run(impl, for_backward):
    def local(x, *ps_):
      q = dict(zip(names, ps_))
      y, aux, res = ops.moe_forward(x, q["router_w"], q["gate_up"], q["down"], q.get("shared_gate_up"),
                                    q.get("shared_down"), q.get("expert_bias"), config=cfg, axis_name="ep",
                                    impl=impl, for_backward=for_backward)
      kept = [f for f in ("xr", "h1", "rows", "hs", "ws") if getattr(res, f) is not None]
      if not for_backward:
        assert kept == [], kept
        with pytest.raises(ValueError, match=r"for_backward=False"):
          ops.moe_backward(res, y, aux, q["router_w"], q["gate_up"], q["down"], q.get("shared_gate_up"),
                           q.get("shared_down"), config=cfg, axis_name="ep", impl=impl)
      return y, aux
    return jax.jit(jax.shard_map(local, mesh=m, in_specs=(P("ep"), *[SPECS[n] for n in names]),
                                 out_specs=(P("ep"), P())))(xs, *ps)

  with fused_on_cpu({"moe_forward": twin}):
    for impl in ("fused", "reference"):
      trimmed, full = run(impl, False), run(impl, True)
      for u, v in zip(trimmed, full):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  assert twin.kept == [0, 1], twin.kept
  with pytest.raises(TypeError, match=r"for_backward=1 must be a bool"):
    ops.moe_forward(xs, *[p[n] for n in names[:3]], config=cfg, axis_name="ep", for_backward=1)


def _layer_grads(cfg, ep, impl, x, p, cot):
  return layer_grads(cfg, ep_mesh(ep), x, p, cot, impl)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_layer_grad_under_fused_is_the_twins(kernel_twin, kind):
  """jax.grad of moe_layer(impl='fused') without a usable GPU: the forward through the
  wrapper, the backward the twin's (the fused backward is unavailable here) from
  residuals without rows."""
  cfg = KINDS[kind]
  p = make_params(cfg, BF16, bool(cfg.shared_expert_intermediate))
  x, cot = fresh((T, cfg.hidden), BF16), fresh((T, cfg.hidden))
  got, want = (_layer_grads(cfg, 1, impl, x, p, cot) for impl in ("fused", "reference"))
  for name in got:
    if name == "expert_bias":
      assert not np.any(np.asarray(got[name]))
      continue
    assert_close(got[name], want[name], BF16, what=f"{kind} d{name} fused vs reference")


def _twin_without_rows(*args, config, axis_name, cu_cap, launch, for_backward):
  """The twin's forward, its residuals stripped of the dispatched rows as the fused
  forward's are: the backward must recompute them."""
  y, aux, res = reference.moe_forward(*args, config=config, axis_name=axis_name)
  return y, aux, res._replace(xr=None, h1=None)


@pytest.mark.parametrize("kind,ep", [("softmax", 1), ("deepseek", 1), ("llama4", 1), ("softmax", 4),
                                     ("deepseek", 2)])
def test_twin_backward_without_saved_rows(kind, ep):
  """Residuals with xr = None (dropless recompute) give the gradients of the saved
  rows' capped backward, in fp32: the capped buffers hold these tokens (checked)."""
  cfg = KINDS[kind].replace(capacity_factor=2.0)
  p = make_params(cfg, jnp.float32, bool(cfg.shared_expert_intermediate))
  x, cot = fresh((T * ep, cfg.hidden)), fresh((T * ep, cfg.hidden))
  assert cfg.capacity(T) < T, "test setup: the twin would run the dropless pass anyway"
  idx = np.asarray(route(x, p["router_w"], cfg, p.get("expert_bias")).indices)
  e_l = cfg.num_experts // ep
  most = max(np.bincount(idx[r * T:(r + 1) * T].ravel(), minlength=cfg.num_experts).max() for r in range(ep))
  assert most <= cfg.capacity(T), f"test setup: capped buffers overflow ({most} > {cfg.capacity(T)}, E_l={e_l})"
  want = _layer_grads(cfg, ep, "reference", x, p, cot)
  with fake_fused({"moe_forward": _twin_without_rows}):
    got = _layer_grads(cfg, ep, "fused", x, p, cot)
  for name in got:
    assert_close(got[name], want[name], jnp.float32, what=f"{kind} ep={ep} d{name} without saved rows")


def test_floor_gemm_lowers_to_its_custom_call(no_gpu_needed):
  """The MoE benchmark's floor (kosmos_jax.testing.grouped_gemm): one custom call, the
  kernel's operands and result, no attributes; its contract refused before lowering."""
  from kosmos_jax.testing import grouped_gemm as gg
  per, te = gg.balanced_tiles(200, 3)
  a, b = jnp.zeros((3 * per, 128), BF16), jnp.zeros((3, 128, 256), BF16)
  text = jax.jit(gg.grouped_gemm).trace(a, b, jnp.asarray(te)).lower(lowering_platforms=("cuda",)).as_text()
  calls = [line for line in text.splitlines() if "custom_call @kosmos_grouped_gemm" in line]
  assert len(calls) == 1 and f"(tensor<{3 * per}x128xbf16>, tensor<3x128x256xbf16>, tensor<6xi32>)" in calls[0]
  assert f"-> tensor<{3 * per}x256xbf16>" in calls[0], calls[0]
  with pytest.raises(ValueError, match=r"a.dtype=float32"):
    gg.grouped_gemm(a.astype(jnp.float32), b, jnp.asarray(te))


def _one_call(fn, args, target):
  text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  calls = [line for line in text.splitlines() if f"custom_call @{target}(" in line]
  assert len(calls) == 1, text
  return calls[0]


def test_backward_floor_gemms_lower_to_their_custom_calls(no_gpu_needed):
  """The backward's floor (dgrad, dgrad2 with the SwiGLU backward, wgrad): one custom call
  each with the kernel's operands and result; shapes and dtypes refused before lowering."""
  from kosmos_jax.testing import grouped_gemm as gg
  per, te = gg.balanced_tiles(200, 3)
  m, te = 3 * per, jnp.asarray(te)
  rb = jnp.asarray(gg.expert_row_blocks(np.asarray(te), 3))
  dy, w2, h1 = jnp.zeros((m, 256), BF16), jnp.zeros((3, 384, 256), BF16), jnp.zeros((m, 768), BF16)
  call = _one_call(gg.grouped_dgrad, (h1, jnp.zeros((3, 256, 768), BF16), te), "kosmos_grouped_dgrad")
  assert f"-> tensor<{m}x256xbf16>" in call, call
  call = _one_call(gg.grouped_swiglu_bwd, (dy, w2, h1, te), "kosmos_grouped_swiglu_bwd")
  assert f"(tensor<{m}x256xbf16>, tensor<3x384x256xbf16>, tensor<{m}x768xbf16>, tensor<6xi32>)" in call, call
  assert f"-> tensor<{m}x768xbf16>" in call, call
  call = _one_call(gg.grouped_wgrad, (h1[:, :384], dy, rb), "kosmos_grouped_wgrad")
  assert "-> tensor<3x384x256xbf16>" in call, call
  with pytest.raises(ValueError, match=r"a.shape=\(768, 768\) and b.shape=\(3, 256, 512\) must be"):
    gg.grouped_dgrad(h1, jnp.zeros((3, 256, 512), BF16), te)
  with pytest.raises(ValueError, match=r"h1.shape=\(768, 700\) must be"):
    gg.grouped_swiglu_bwd(dy, w2, jnp.zeros((m, 700), BF16), te)
  with pytest.raises(ValueError, match=r"tile_expert.shape=\(5,\) must be \(6,\)"):
    gg.grouped_swiglu_bwd(dy, w2, h1, te[:5])
  with pytest.raises(ValueError, match=r"P=200 must be multiples of 128"):
    gg.grouped_wgrad(h1[:, :200], dy, rb)
  with pytest.raises(ValueError, match=r"expert_rb.dtype=float32"):
    gg.grouped_wgrad(h1[:, :384], dy, rb.astype(jnp.float32))


def test_nn_module_takes_and_checks_launch():
  from flax import nnx
  from kosmos_jax.nn import MoE
  m = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("ep",))
  with pytest.raises(TypeError, match=r"MoE: launch=3 must be of type MoeLaunch"):
    MoE(SOFTMAX, mesh=m, launch=3, rngs=nnx.Rngs(0))
  model = MoE(SOFTMAX, mesh=m, launch=MoeLaunch(movers=2, switching=False), impl="reference", rngs=nnx.Rngs(0))
  assert model.launch == MoeLaunch(movers=2, switching=False)
  x = put(fresh((2, 16, SOFTMAX.hidden)), m, P(None, "ep", None))
  with jax.set_mesh(m):
    y, _ = nnx.jit(lambda mod, x: mod(x))(model, x)
  assert y.shape == x.shape


# ---- the fused backward's Python side (kosmos_jax/ops/_fused_moe_bwd.py) -------------

def _fwd_bwd(cfg, fwd_impl="fused", ep=1):
  """Jitted (x, cot, *params) -> (dx, dgate_up, ddown) of ops.moe_backward(impl='fused')
  after ops.moe_forward(impl=fwd_impl), over an EP mesh of ep devices."""
  names = _names(make_params(cfg, BF16, bool(cfg.shared_expert_intermediate)))

  def local(x, cot, *ps):
    p = dict(zip(names, ps))
    _, _, res = ops.moe_forward(x, p["router_w"], p["gate_up"], p["down"], p.get("shared_gate_up"),
                                p.get("shared_down"), p.get("expert_bias"), config=cfg, axis_name="ep", impl=fwd_impl)
    g = ops.moe_backward(res, cot, jnp.float32(1.0), p["router_w"], p["gate_up"], p["down"], p.get("shared_gate_up"),
                         p.get("shared_down"), config=cfg, axis_name="ep", impl="fused")
    return g[0], g[2], g[3]

  m = ep_mesh(ep)
  f = jax.shard_map(local, mesh=m, in_specs=(P("ep"), P("ep"), *[SPECS[n] for n in names]),
                    out_specs=(P("ep"), SPECS["gate_up"], SPECS["down"]))
  return jax.jit(f), m


def _fwd_bwd_lowered(cfg, fwd_impl="fused", ep=1):
  f, m = _fwd_bwd(cfg, fwd_impl, ep)
  _, xs, ps = place(m, fresh((T, cfg.hidden), BF16), make_params(cfg, BF16, bool(cfg.shared_expert_intermediate)))
  return f.trace(xs, put(fresh((T, cfg.hidden), BF16), m, P("ep")), *ps).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_backward_lowers_to_one_custom_call(no_gpu_needed, kind):
  """ops.moe_backward(impl='fused') after the fused forward: one kosmos_moe_backward call
  on dY, the routing, the weights, the forward's workspace and the shared expert's
  operands, with every result the kernel writes."""
  cfg = KINDS[kind].replace(hidden=128)
  shared = bool(cfg.shared_expert_intermediate)
  text = _fwd_bwd_lowered(cfg)
  calls = [line for line in text.splitlines() if "custom_call @kosmos_moe_backward" in line]
  assert len(calls) == 1, text[-3000:]
  call = calls[0]
  e, h, i, k = cfg.num_experts, cfg.hidden, cfg.expert_intermediate, cfg.top_k
  fws, bws = moe_workspace_bytes(T, k, e, h, i, shared), moe_backward_workspace_bytes(T, k, e, h, i, shared)
  x, hs, sw1, sw2 = ((f"{T}x{h}xbf16", f"{T}x{2 * i}xbf16", f"{h}x{2 * i}xbf16", f"{i}x{h}xbf16") if shared
                     else ("1xbf16",) * 4)
  assert (f"(tensor<{T}x{h}xbf16>, tensor<{T}x{k}xi32>, tensor<{T}x{k}xf32>, tensor<{e}x{h}x{2 * i}xbf16>, "
          f"tensor<{e}x{i}x{h}xbf16>, tensor<{fws}xui8>, tensor<{x}>, tensor<{hs}>, tensor<{sw1}>, "
          f"tensor<{sw2}>)") in call, call
  r = moe_arena_rows(T, k, e) + moe_shared_rows(T, shared)
  assert (f"-> (tensor<{T}x{h}xbf16>, tensor<{r}x{h}xbf16>, tensor<{T}x{k}xi32>, tensor<{e}x{h}x{2 * i}xbf16>, "
          f"tensor<{e}x{i}x{h}xbf16>, tensor<{sw1 if shared else '1xbf16'}>, tensor<{sw2 if shared else '1xbf16'}>, "
          f"tensor<{bws}xui8>)") in call, call
  for attr in (f"input_gating = {int(cfg.gating == 'input')} : i64", f"shared = {int(shared)} : i64"):
    assert attr in call, (attr, call)


def test_backward_limits_raise_before_lowering(no_gpu_needed):
  """What the fused backward cannot run is refused with the values named: a hidden size
  the forward takes but the weight gradients' tiles do not, and residuals of a forward
  that was not fused (they hold no workspace)."""
  with pytest.raises(ValueError, match=r"moe_backward \(fused\): hidden=192 must be a multiple of 128"):
    _fwd_bwd_lowered(SOFTMAX.replace(hidden=192))
  with pytest.raises(ValueError, match=r"\(residuals.ws is None\): the fused backward reads the fused forward.s rows"):
    _fwd_bwd_lowered(SOFTMAX.replace(hidden=128), fwd_impl="reference")


class _Gpu:
  platform = "gpu"

  def __init__(self, cc):
    self.compute_capability = cc


def _auto_choice(monkeypatch, cfg, t, ep=1, dtype=BF16, precision=None):
  """What impl='auto' runs for ops.moe_forward on x [t, hidden] per device (traced
  abstractly; the call's choice recorded), and auto's reason when it keeps the twin."""
  from kosmos_jax.ops import moe as ops_moe
  seen = []

  def spy(op, impl, call=None):
    seen.append((ops.choose(op, impl, call), ops.auto_note(op, call)))
    return seen[-1][0]

  monkeypatch.setattr(ops_moe, "choose", spy)
  p = make_params(cfg, jnp.float32, bool(cfg.shared_expert_intermediate))
  names = _names(p)

  def local(x, *ps):
    q = dict(zip(names, ps))
    y, aux, _ = ops.moe_forward(x, q["router_w"], q["gate_up"], q["down"], q.get("shared_gate_up"),
                                q.get("shared_down"), q.get("expert_bias"), config=cfg, axis_name="ep",
                                impl="auto", precision=precision)
    return y, aux

  f = jax.shard_map(local, mesh=ep_mesh(ep), in_specs=(P("ep"), *[SPECS[n] for n in names]),
                    out_specs=(P("ep"), P()))
  structs = [jax.ShapeDtypeStruct((t * ep, cfg.hidden), dtype)]
  structs += [jax.ShapeDtypeStruct(p[n].shape, jnp.float32 if n == "expert_bias" else dtype) for n in names]
  jax.eval_shape(f, *structs)
  assert len(seen) == 1, seen
  return seen[0]


@pytest.mark.parametrize("case,t,want", [
    ("hopper", 512, ""),                                   # 512 * 2 / 8 = 128 pairs per expert
    ("few_pairs", 504, r"t=504 tokens x top_k=2 route 126 pairs to each of num_experts=8 on average"),
    ("ampere", 512, r"measured faster only with its Hopper builders"),
    ("portable", 512, r"measured faster only with its Hopper builders"),
    ("ep2", 512, r"at EP > 1 the fused MoE layer has been run only as loopback ranks"),
    ("fp32", 512, r"x.dtype=float32 is not supported"),
    ("precision", 512, r"precision=.*HIGHEST.* asks for the twin"),
])
def test_auto_runs_the_fused_layer_where_it_was_measured_faster(no_gpu_needed, monkeypatch, case, t, want):
  """auto's rule for the MoE layer (ops/_fused_moe.py auto_rule): fused at EP = 1, bf16, on
  compute capability 9.0 with the Hopper builders, precision None, and at least one
  128-row block of pairs per expert on average; the twin elsewhere, never an error."""
  monkeypatch.setattr(jax, "local_devices", lambda *a, **k: [_Gpu("8.0" if case == "ampere" else "9.0")])
  if case == "portable":
    monkeypatch.setenv("KOSMOS_FUSED_BUILDERS", "portable")
  else:
    monkeypatch.delenv("KOSMOS_FUSED_BUILDERS", raising=False)
  chose, why = _auto_choice(monkeypatch, SOFTMAX, t, ep=2 if case == "ep2" else 1,
                            dtype=jnp.float32 if case == "fp32" else BF16,
                            precision=jax.lax.Precision.HIGHEST if case == "precision" else None)
  assert chose == ("fused" if not want else "reference"), (chose, why)
  if want:
    assert re.search(want, why), why
  else:
    assert why == ""


def test_auto_backward_follows_the_forward(no_gpu_needed):
  """The fused backward reads the fused forward's workspace: auto runs it only after one."""
  class _Res:
    ws = None
    x = jnp.zeros((8, 64), BF16)

  call = ((_Res(), None, None), dict(config=SOFTMAX, axis_name="ep", precision=None))
  assert ops.choose("moe_backward", "auto", call) == "reference"
  assert "the forward ran the reference twin" in ops.auto_note("moe_backward", call)


def test_lowers_at_ep2_with_the_mesh_groups(no_gpu_needed):
  """At EP > 1 the launch carries its EP groups (global device ids from the mesh), ep and
  a control slot per group, as the TP+SP ops do; w1 holds the rank's experts and y_rows
  gains the returned rows."""
  cfg = SOFTMAX
  p = make_params(cfg, BF16, False)
  f, m = _forward(cfg, 2, "fused")
  _, xs, ps = place(m, fresh((T, cfg.hidden), BF16), p)
  text = f.trace(xs, *ps).lower(lowering_platforms=("cuda",)).as_text()
  calls = [line for line in text.splitlines() if "custom_call @kosmos_moe_forward" in line]
  assert len(calls) == 1, text[-3000:]
  call, t, e, h, i, k = calls[0], T // 2, cfg.num_experts, cfg.hidden, cfg.expert_intermediate, cfg.top_k
  ids = [d.id for d in m.devices.reshape(-1)]
  assert f"groups = dense<[{ids[0]}, {ids[1]}]> : tensor<2xi64>" in call, call
  assert "ep = 2 : i64" in call and "slots = dense<" in call, call
  r = moe_arena_rows(t, k, e, 2) + moe_shared_rows(t, False) + moe_return_rows(t, k, e, 2)
  assert f"tensor<{e // 2}x{h}x{2 * i}xbf16>" in call and f"tensor<{r}x{h}xbf16>" in call, call
  assert f"tensor<{moe_workspace_bytes(t, k, e, h, i, False, 2)}xui8>" in call, call


def test_backward_lowers_at_ep2_with_the_mesh_groups(no_gpu_needed):
  """At EP > 1 the fused backward follows the fused forward over the same EP groups: it
  takes x (each rank pushes its pairs' x rows to their owners for wgrad1), the forward's
  EP workspace, its rank's experts, and returns dx_rows with the returned rows."""
  cfg = SOFTMAX.replace(hidden=128)
  text = _fwd_bwd_lowered(cfg, ep=2)
  calls = [line for line in text.splitlines() if "custom_call @kosmos_moe_backward" in line]
  assert len(calls) == 1, text[-3000:]
  call, t, e, h, i, k = calls[0], T // 2, cfg.num_experts, cfg.hidden, cfg.expert_intermediate, cfg.top_k
  m = ep_mesh(2)
  ids = [d.id for d in m.devices.reshape(-1)]
  assert f"groups = dense<[{ids[0]}, {ids[1]}]> : tensor<2xi64>" in call and "ep = 2 : i64" in call, call
  fws, bws = moe_workspace_bytes(t, k, e, h, i, False, 2), moe_backward_workspace_bytes(t, k, e, h, i, False, 2)
  assert (f"tensor<{e // 2}x{i}x{h}xbf16>, tensor<{fws}xui8>, tensor<{t}x{h}xbf16>, tensor<1xbf16>") in call, call
  r = moe_arena_rows(t, k, e, 2) + moe_return_rows(t, k, e, 2)
  assert f"-> (tensor<{t}x{h}xbf16>, tensor<{r}x{h}xbf16>" in call and f"tensor<{bws}xui8>)" in call, call
