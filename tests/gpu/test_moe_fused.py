"""The fused MoE forward (kosmos_moe_forward, EP = 1) on one GPU, against its twin
(reference.moe_forward) and the dense per-token oracle (tests/moe_oracle.py), for every
preset's router kind at small sizes: softmax top-k; DeepSeek's group-limited sigmoid
with a selection bias and a shared expert; Llama 4's top-1 sigmoid with input gating
and a shared expert. Also: the launch's own outputs (pair_row maps every pair into its
expert's arena segment, rows distinct, in the plan's stable order), 200 back-to-back
calls with changing routing, a grid of one CTA and a CU cap, bitwise determinism,
skewed routing (never a dropped token), the launch knobs (same bits), and jax.grad of
the layer under impl="fused" (forward fused, backward the twin's).

Engines: the module runs the Hopper builders on a compute-capability-9.0 GPU and the
portable builders on any other (or under KOSMOS_FUSED_BUILDERS=portable), and checks
that the launches were counted for that engine; on a Hopper GPU one more test runs
the portable builders in a child process (the variable is read once per process) on
the same small shapes.

Outputs are poisoned before each launch (KOSMOS_POISON_OUTPUT, tests/gpu/conftest.py),
so an unwritten element shows as NaN, which no comparison passes.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from helpers import assert_close, fresh, put, rel_err
from kosmos_jax import MoeLaunch, ops
from kosmos_jax.moe import MoEConfig, route
from kosmos_jax.reference import moe as ref_moe
from kosmos_jax.reference import moe_router
from kosmos_jax.testing import (MOE_TILE_ROWS, builder_runs, moe_arena_rows, moe_forward_built, moe_forward_kernel,
                                moe_pick_experts)
from moe_oracle import NAMES, SPECS, dense_moe, layer_grads, make_params, to_f32

pytestmark = pytest.mark.skipif(not moe_forward_built(), reason="kosmos_moe_forward is not compiled into this "
                                "extension (a CUDA build)")

BF16 = jnp.bfloat16
# Fused vs twin: the same math in bf16 with fp32 accumulation, rounded at other points
# (e.g. the SwiGLU epilogue on the fp32 accumulator): two bf16 ulps (2^-8 each) of
# relative error, in norm. Against the fp32 dense oracle, the bf16 table (DESIGN.md §6).
TWIN_RTOL = 2 * 2.0 ** -8

KINDS = {
    "softmax": MoEConfig(num_experts=8, top_k=2, hidden=256, expert_intermediate=256, score="softmax",
                         norm_topk_prob=True, aux_loss_coeff=0.01),
    "deepseek": MoEConfig(num_experts=32, top_k=4, hidden=256, expert_intermediate=128, score="sigmoid",
                          norm_topk_prob=True, n_groups=4, topk_groups=2, route_scale=2.5, use_expert_bias=True,
                          aux_loss_coeff=0.01, shared_expert_intermediate=128),
    "llama4": MoEConfig(num_experts=8, top_k=1, hidden=256, expert_intermediate=256, score="sigmoid",
                        gating="input", shared_expert_intermediate=256),
}


def _gpu():
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  if not gpus:
    pytest.skip("no GPU")
  return gpus[0]


def _mesh():
  return jax.sharding.Mesh(np.array([_gpu()]), ("ep",))


def _engine():
  """The builders this process's launches run (csrc/moe_fwd_cuda.cu's rule)."""
  portable = os.environ.get("KOSMOS_FUSED_BUILDERS") == "portable" or _gpu().compute_capability != "9.0"
  return "portable" if portable else "sm90"


def _params(cfg, skew=False):
  p = make_params(cfg, BF16, bool(cfg.shared_expert_intermediate))
  if skew and cfg.use_expert_bias:  # +10 on experts 0..k-1: every token picks them
    p["expert_bias"] = jnp.zeros((cfg.num_experts,), jnp.float32).at[:cfg.top_k].set(10.0)
  elif skew:  # the router prefers experts 0 and 1 on feature 0, which every token has
    rw = np.array(jnp.asarray(p["router_w"], jnp.float32)) * 0.3
    rw[0, 0], rw[0, 1] = 3.0, 1.5
    p["router_w"] = jnp.asarray(rw, BF16)
  return p


def _tokens(cfg, t, skew=False):
  x = fresh((t, cfg.hidden), BF16)
  return x.at[:, 0].set(jnp.abs(x[:, 0]) + 1.0) if skew else x


def _names(cfg):
  return tuple(n for n in NAMES if n in make_params(cfg, jnp.float32, bool(cfg.shared_expert_intermediate)))


@functools.lru_cache(maxsize=None)
def _forward(cfg, impl, cu_cap=None, launch=None, for_backward=True):
  """Jitted (x, *params) -> (y, aux) of ops.moe_forward on the EP = 1 mesh."""
  names, m = _names(cfg), _mesh()

  def local(x, *ps):
    p = dict(zip(names, ps))
    y, aux, _ = ops.moe_forward(x, p["router_w"], p["gate_up"], p["down"], p.get("shared_gate_up"),
                                p.get("shared_down"), p.get("expert_bias"), config=cfg, axis_name="ep",
                                impl=impl, cu_cap=cu_cap, launch=launch, for_backward=for_backward)
    return y, aux

  f = jax.shard_map(local, mesh=m, in_specs=(P("ep"), *[SPECS[n] for n in names]), out_specs=(P("ep"), P()))
  return jax.jit(f)


def _run(cfg, impl, x, p, **kw):
  m = _mesh()
  return _forward(cfg, impl, **kw)(put(x, m, P("ep")), *[put(p[n], m, SPECS[n]) for n in _names(cfg)])


@functools.lru_cache(maxsize=None)
def _kernel(cfg, cu_cap=None, launch=None, keep_preacts=True):
  """Jitted launch alone on the twin's routing: (y, y_rows, pair_row, indices, weights,
  hs), hs None without a shared expert or kept pre-activations."""
  e, h, i = cfg.num_experts, cfg.hidden, cfg.expert_intermediate

  def f(x, router_w, gate_up, down, bias, shared_gate_up, shared_down):
    r = route(x, router_w, cfg, bias)
    sw1 = None if shared_gate_up is None else shared_gate_up.reshape(h, -1)
    y, y_rows, pair_row, hs = moe_forward_kernel(x, r.indices, r.weights, gate_up.reshape(e, h, 2 * i), down, sw1,
                                                 shared_down, input_gating=cfg.gating == "input", cu_cap=cu_cap,
                                                 launch=launch, keep_preacts=keep_preacts)
    return y, y_rows, pair_row, r.indices, r.weights, hs

  return jax.jit(f)


def _launch(cfg, x, p, **kw):
  _gpu()  # skips without a GPU
  return _kernel(cfg, **kw)(x, p["router_w"], p["gate_up"], p["down"], p.get("expert_bias"),
                            p.get("shared_gate_up"), p.get("shared_down"))


def _pair_outputs(cfg, x, p, idx, w):
  """Each pair's expert output [t, k, h] in XLA (every expert on every pair, then picked)."""
  t, k = idx.shape
  if cfg.gating == "input":  # each pair's row scaled by its weight, rounded to bf16
    rows = (w[..., None] * x.astype(jnp.float32)[:, None, :]).astype(x.dtype)
  else:
    rows = jnp.broadcast_to(x[:, None, :], (t, k, x.shape[1]))
  e = cfg.num_experts
  _, out = ref_moe.experts_forward(jnp.broadcast_to(rows.reshape(1, t * k, -1), (e, t * k, x.shape[1])),
                                   p["gate_up"].reshape(e, cfg.hidden, -1), p["down"])
  return out[idx.reshape(-1), jnp.arange(t * k)].reshape(t, k, -1)


def _check_pair_rows(cfg, t, idx, pair_row, stable=False):
  """Every pair's row lies in its expert's arena segment (expert-major, each segment
  padded to the tile rows), and no two pairs share a row; with stable=True the rows
  follow the plan's stable order (token-major within an expert)."""
  idx, rows = np.asarray(idx), np.asarray(pair_row)
  counts = np.bincount(idx.ravel(), minlength=cfg.num_experts)
  padded = -(-counts // MOE_TILE_ROWS) * MOE_TILE_ROWS
  start = np.cumsum(padded) - padded
  assert rows.min() >= 0 and rows.max() < moe_arena_rows(t, cfg.top_k, cfg.num_experts)
  lo, hi = start[idx], start[idx] + counts[idx]
  bad = np.argwhere((rows < lo) | (rows >= hi))
  assert bad.size == 0, f"pairs outside their expert's segment: {bad[:5].tolist()}"
  assert len(np.unique(rows)) == rows.size, "two pairs share an arena row"
  if stable:
    order = np.argsort(idx.ravel(), kind="stable")
    want = np.empty(idx.size, np.int64)
    want[order] = np.arange(idx.size) - np.repeat(np.cumsum(counts) - counts, counts)
    np.testing.assert_array_equal(rows.ravel(), start[idx.ravel()] + want)


# The routing's selection kernel (kernels/moe/select.cuh) on the preset routers' widths
# too: Qwen3's softmax top-8 of 128, DeepSeek-V3's group-limited top-8 of 256, Llama 4's
# top-1 of 16, and the widest rule the kernel takes (E = 512, k = 32).
SELECT_RULES = dict(KINDS, qwen3=MoEConfig(num_experts=128, top_k=8, hidden=64, expert_intermediate=128),
                    deepseek_v3=MoEConfig(num_experts=256, top_k=8, hidden=64, expert_intermediate=128,
                                          score="sigmoid", n_groups=8, topk_groups=4, use_expert_bias=True),
                    scout=MoEConfig(num_experts=16, top_k=1, hidden=64, expert_intermediate=128, score="sigmoid"),
                    widest=MoEConfig(num_experts=512, top_k=32, hidden=64, expert_intermediate=128,
                                     n_groups=64, topk_groups=8))


@pytest.mark.parametrize("rule", sorted(SELECT_RULES))
@pytest.mark.parametrize("scores", ["normal", "ties", "nan"])
def test_selection_kernel_picks_the_twins_ids(rule, scores):
  """The same ids as moe_router.pick (the twin's selection) on the same scores, bit for
  bit: fresh ones, ones with many exact ties (-0 among them; lower id first, groups
  too), and NaN rows and entries (+NaN first, as lax.top_k ranks it). The twin runs on
  the CPU backend, the selection's reference (tests/test_host_moe_select.py)."""
  cfg = SELECT_RULES[rule]
  t, e = 1000, cfg.num_experts  # 1000: a partial CTA of tokens
  s = fresh((t, e), jnp.float32)
  if scores == "ties":
    s = jnp.round(s * 2) / 2
  if scores == "nan":
    s = s.at[3].set(jnp.nan).at[7, ::3].set(jnp.nan)
  bias = fresh((e,), jnp.float32) * 0.1 if cfg.use_expert_bias else None
  if scores == "ties" and bias is not None:
    bias = jnp.round(bias * 20) / 20
  rule_kw = dict(top_k=cfg.top_k, n_groups=cfg.n_groups, topk_groups=cfg.topk_groups)
  cpu = jax.devices("cpu")[0]
  want = jax.jit(lambda a, b: moe_router.pick(a, bias=b, **rule_kw))(*jax.device_put((s, bias), cpu))
  s, bias = jax.device_put((s, bias), _gpu())
  for _ in range(2):  # back to back: the second call on the first's memory
    got = jax.jit(lambda a, b: moe_pick_experts(a, bias=b, **rule_kw))(s, bias)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


CASES = [(kind, t) for kind in KINDS for t in (512, 300)]  # 300: a partial token block


@pytest.mark.parametrize("kind,t", CASES, ids=[f"{k}-t{t}" for k, t in CASES])
def test_matches_twin_and_oracle(kind, t):
  cfg = KINDS[kind]
  p, x = _params(cfg), _tokens(cfg, t)
  y, aux = _run(cfg, "fused", x, p)
  yr, auxr = _run(cfg, "reference", x, p)
  assert_close(y, yr, BF16, rtol=TWIN_RTOL, what=f"{kind} t={t} fused vs twin")
  # XLA computes both from the same routing, in differently fused programs: fp32 sums
  # may reassociate, so a few fp32 ulps (measured 1.9e-7 relative), never more.
  np.testing.assert_allclose(np.asarray(aux), np.asarray(auxr), rtol=1e-5, atol=0)
  yd, _ = dense_moe(jnp.asarray(x, jnp.float32), to_f32(p), cfg)
  assert_close(y, yd, BF16, what=f"{kind} t={t} fused vs dense oracle")


def test_counts_the_engine_it_ran():
  """Every launch is counted for the builders it ran, and only for those."""
  cfg, t = KINDS["softmax"], 300
  p, x = _params(cfg), _tokens(cfg, t)
  before = builder_runs()["moe_forward"]
  jax.block_until_ready(_launch(cfg, x, p))
  after = builder_runs()["moe_forward"]
  ran = {e: after[e] - before[e] for e in after}
  assert ran == {"sm90": int(_engine() == "sm90"), "portable": int(_engine() == "portable")}, ran


def test_backward_counts_the_engine_it_ran():
  """A fused training step counts one backward launch, for the builders it ran."""
  cfg, t = KINDS["softmax"], 300
  p, x, cot = _params(cfg), _tokens(cfg, t), fresh((t, cfg.hidden))
  before = builder_runs()["moe_backward"]
  jax.block_until_ready(_layer_grads(cfg, "fused", x, p, cot))
  after = builder_runs()["moe_backward"]
  ran = {e: after[e] - before[e] for e in after}
  assert ran == {"sm90": int(_engine() == "sm90"), "portable": int(_engine() == "portable")}, ran


def _owned(cfg, t, pair_row):
  """The rows of y_rows the launch owns: every pair's, then the shared expert's t."""
  own = np.asarray(pair_row).ravel()
  if cfg.shared_expert_intermediate:
    r = moe_arena_rows(t, cfg.top_k, cfg.num_experts)
    own = np.concatenate([own, np.arange(r, r + t)])
  return own


# The portable builders on a Hopper GPU: a fresh interpreter under
# KOSMOS_FUSED_BUILDERS=portable runs this module's checks on its small shapes.
_PORTABLE_CHILD = """
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
import jax, jax.numpy as jnp, numpy as np
import test_moe_fused as T
from helpers import rel_err
from kosmos_jax.testing import builder_runs
out = {'errs': {}, 'bits': {}}
for kind in sorted(T.KINDS):
  cfg, t = T.KINDS[kind], 300
  p, x = T._params(cfg), T._tokens(cfg, t)
  out['errs'][kind] = [rel_err(T._run(cfg, 'fused', x, p)[0], T._run(cfg, 'reference', x, p)[0])]
  full, one = T._launch(cfg, x, p), T._launch(cfg, x, p, cu_cap=1)
  y_rows, pair_row, idx, w = full[1], full[2], full[3], full[4]
  got = jnp.asarray(y_rows)[jnp.asarray(pair_row)]
  out['errs'][kind].append(rel_err(got, T._pair_outputs(cfg, x, p, idx, w)))
  if cfg.shared_expert_intermediate:
    out['errs'][kind] += T._shared_errs(cfg, x, p, full)
  try:
    T._check_pair_rows(cfg, t, idx, pair_row, stable=True)
    for name, a, b in zip(('y', 'y_rows', 'pair_row', 'hs'), full[:3] + full[5:], one[:3] + one[5:]):
      T._assert_bits(a, b, f'{kind} {name} cu_cap=1 vs full grid', rows=(name == 'y_rows', T._owned(cfg, t, pair_row)))
    out['bits'][kind] = ''
  except AssertionError as e:
    out['bits'][kind] = str(e)
out['grads'] = {}
for kind in sorted(T.KINDS):  # the backward: every gradient, and a grid of one CTA's bits
  cfg, t = T.KINDS[kind], 300
  p, x, cot = T._params(cfg), T._tokens(cfg, t), T.fresh((t, cfg.hidden))
  got, want = T._layer_grads(cfg, 'fused', x, p, cot), T._layer_grads(cfg, 'reference', x, p, cot)
  one = T._layer_grads(cfg, 'fused', x, p, cot, cu_cap=1)
  msgs = []
  for name in got:
    try:
      if name == 'expert_bias':
        assert not np.any(np.asarray(got[name])), f'{kind} dexpert_bias is not zero'
        continue
      T.assert_close(got[name], want[name], T.BF16, what=f'{kind} d{name} portable vs reference')
      assert np.array_equal(np.asarray(one[name], np.float32), np.asarray(got[name], np.float32)), \
          f'{kind} d{name}: cu_cap=1 differs from the full grid'
    except AssertionError as e:
      msgs.append(str(e)[:500])
  out['grads'][kind] = msgs
out['runs'] = builder_runs()['moe_forward']
out['runs_bwd'] = builder_runs()['moe_backward']
print('RESULT', json.dumps(out))
"""


def test_portable_builders_on_hopper():
  """KOSMOS_FUSED_BUILDERS=portable: the portable builders on a Hopper GPU, every
  router kind against the twin (y, and y_rows[pair_row] against each pair's expert
  output; every gradient of the layer, both directions fused), the stable plan, a
  grid of one CTA with the full grid's bits, and every launch counted as portable."""
  if _engine() != "sm90":
    pytest.skip("this process already runs the portable builders in every test of the module")
  here = os.path.dirname(os.path.abspath(__file__))
  env = dict(os.environ, KOSMOS_FUSED_BUILDERS="portable", KOSMOS_POISON_OUTPUT="1")
  r = subprocess.run([sys.executable, "-c", _PORTABLE_CHILD, json.dumps([here, os.path.dirname(here)])], env=env,
                     capture_output=True, text=True, timeout=600)
  lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
  assert r.returncode == 0 and lines, f"child failed (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
  out = json.loads(lines[-1][len("RESULT "):])
  assert out["runs"] == {"sm90": 0, "portable": 5 * len(KINDS)}, out["runs"]
  assert out["runs_bwd"] == {"sm90": 0, "portable": 2 * len(KINDS)}, out["runs_bwd"]
  for kind, errs in out["errs"].items():
    assert all(e <= TWIN_RTOL for e in errs), f"{kind}: portable rel. errors (y, y_rows) {errs} > {TWIN_RTOL:.1e}"
  bad = {kind: msg for kind, msg in out["bits"].items() if msg}
  assert not bad, bad
  bad = {kind: msgs for kind, msgs in out["grads"].items() if msgs}
  assert not bad, bad


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_launch_outputs(kind):
  """pair_row is a permutation-consistent map into the arena, and y_rows holds each
  pair's expert output there; y is finite."""
  cfg, t = KINDS[kind], 300
  p, x = _params(cfg), _tokens(cfg, t)
  y, y_rows, pair_row, idx, w, _ = _launch(cfg, x, p)
  assert np.all(np.isfinite(np.asarray(y, np.float32))), "y has NaN/Inf (unwritten or poisoned)"
  _check_pair_rows(cfg, t, idx, pair_row)
  got = jnp.asarray(y_rows)[jnp.asarray(pair_row)]
  assert_close(got, _pair_outputs(cfg, x, p, idx, w), BF16, rtol=TWIN_RTOL, what=f"{kind} y_rows[pair_row]")


def _shared_errs(cfg, x, p, out):
  """Relative errors of the launch's shared expert rows (y_rows past the arena) and
  pre-activations hs against the twin's shared_forward."""
  t, h = x.shape
  hs_want, ys_want = ref_moe.shared_forward(x, p["shared_gate_up"].reshape(h, -1), p["shared_down"])
  r = moe_arena_rows(t, cfg.top_k, cfg.num_experts)
  return [rel_err(jnp.asarray(out[1])[r:r + t], ys_want), rel_err(out[5], hs_want)]


@pytest.mark.parametrize("kind", ["deepseek", "llama4"])
@pytest.mark.parametrize("t", [512, 300])
def test_shared_expert_in_the_launch(kind, t):
  """The shared expert's tiles: its output rows (y_rows past the arena, token order)
  and its bf16 pre-activations (hs, the backward's residual) against the twin's
  shared_forward, every element written (poisoned outputs would be NaN)."""
  cfg = KINDS[kind]
  p, x = _params(cfg), _tokens(cfg, t)
  out = _launch(cfg, x, p)
  hs = np.asarray(out[5], np.float32)
  assert hs.shape == (t, 2 * cfg.expert_intermediate) and np.all(np.isfinite(hs)), "hs unwritten"
  errs = _shared_errs(cfg, x, p, out)
  assert max(errs) <= TWIN_RTOL, f"{kind} t={t}: shared rows, hs rel. errors {errs} > {TWIN_RTOL:.1e}"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_pair_rows_follow_the_stable_plan(kind):
  cfg, t = KINDS[kind], 512
  p, x = _params(cfg), _tokens(cfg, t)
  _, _, pair_row, idx, _, _ = _launch(cfg, x, p)
  _check_pair_rows(cfg, t, idx, pair_row, stable=True)


@pytest.mark.parametrize("cap", [None, 20])
def test_back_to_back_200_calls_changing_routing(cap):
  """200 calls queued back to back, each on fresh tokens (so fresh routing), then each
  compared with the twin on the same tokens."""
  cfg, t = KINDS["deepseek"], 512
  p = _params(cfg)
  xs = [_tokens(cfg, t) for _ in range(200)]
  ys = [_run(cfg, "fused", x, p, cu_cap=cap)[0] for x in xs]
  errs = [rel_err(y, _run(cfg, "reference", x, p)[0]) for x, y in zip(xs, ys)]
  worst = int(np.argmax(errs))
  assert max(errs) <= TWIN_RTOL, f"call {worst}: rel. error {errs[worst]:.3e} > {TWIN_RTOL:.1e}"


@pytest.mark.parametrize("cap", [1, 20])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cu_cap_same_bits(kind, cap):
  """A grid of one CTA (every role in one CTA life) and a capped grid finish, and give
  the full grid's bits: no output depends on which CTA computed it."""
  cfg, t = KINDS[kind], 300
  p, x = _params(cfg), _tokens(cfg, t)
  full = _launch(cfg, x, p)
  capped = _launch(cfg, x, p, cu_cap=cap)
  assert_close(capped[0], _run(cfg, "reference", x, p)[0], BF16, rtol=TWIN_RTOL, what=f"{kind} cap={cap} vs twin")
  for name, a, b in zip(("y", "y_rows", "pair_row", "hs"), full[:3] + full[5:], capped[:3] + capped[5:]):
    _assert_bits(a, b, f"{kind} {name} cu_cap={cap} vs full grid", rows=(name == "y_rows", _owned(cfg, t, full[2])))


def _assert_bits(a, b, what, rows=(False, None)):
  """Bitwise equality; for y_rows only the rows the launch owns (_owned: padding rows
  are scratch). None (no shared expert's hs) equals None."""
  if a is None or b is None:
    assert a is None and b is None, f"{what}: one is None"
    return
  a, b = np.asarray(a), np.asarray(b)
  if rows[0]:
    own = np.asarray(rows[1]).ravel()
    a, b = a[own], b[own]
  if a.dtype == np.dtype(jnp.bfloat16):
    a, b = a.view(np.uint16), b.view(np.uint16)
  diff = np.argwhere(a != b)
  assert diff.size == 0, f"{what}: {len(diff)} elements differ, first at {diff[:3].tolist()}"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_two_runs_bitwise_equal(kind):
  cfg, t = KINDS[kind], 512
  p, x = _params(cfg), _tokens(cfg, t)
  a, b = _launch(cfg, x, p), _launch(cfg, x, p)
  for name, u, v in zip(("y", "y_rows", "pair_row", "hs"), a[:3] + a[5:], b[:3] + b[5:]):
    _assert_bits(u, v, f"{kind} {name} run 2 vs run 1", rows=(name == "y_rows", _owned(cfg, t, a[2])))
  ya, yb = _run(cfg, "fused", x, p)[0], _run(cfg, "fused", x, p)[0]
  _assert_bits(ya, yb, f"{kind} ops.moe_forward y run 2 vs run 1")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_forward_without_preacts_same_bits(kind):
  """A launch that keeps no pre-activations (a forward outside a gradient) gives the
  same outputs, bit for bit, as one that keeps them, and so does ops.moe_forward with
  for_backward=False (what moe_layer's forward outside jax.grad runs)."""
  cfg, t = KINDS[kind], 512
  p, x = _params(cfg), _tokens(cfg, t)
  kept, bare = _launch(cfg, x, p), _launch(cfg, x, p, keep_preacts=False)
  assert bare[5] is None, "no hs from a launch that keeps no pre-activations"
  for name, u, v in zip(("y", "y_rows", "pair_row"), bare[:3], kept[:3]):
    _assert_bits(u, v, f"{kind} {name} without vs with pre-activations",
                 rows=(name == "y_rows", _owned(cfg, t, kept[2])))
  fwd, _ = _run(cfg, "fused", x, p, for_backward=False)
  _assert_bits(fwd, _run(cfg, "fused", x, p)[0], f"{kind} ops.moe_forward y, for_backward False vs True")


@pytest.mark.parametrize("launch", [MoeLaunch(movers=1), MoeLaunch(switching=False),
                                    MoeLaunch(movers=1, switching=False), MoeLaunch(movers=8, switching=False)],
                         ids=["movers1", "fixed", "movers1-fixed", "movers8-fixed"])
@pytest.mark.parametrize("kind", ["softmax", "deepseek"])
def test_launch_knobs_same_bits(kind, launch):
  cfg, t = KINDS[kind], 512
  p, x = _params(cfg), _tokens(cfg, t)
  base, knob = _launch(cfg, x, p), _launch(cfg, x, p, launch=launch)
  for name, u, v in zip(("y", "y_rows", "pair_row", "hs"), base[:3] + base[5:], knob[:3] + knob[5:]):
    _assert_bits(u, v, f"{kind} {name} {launch} vs default", rows=(name == "y_rows", _owned(cfg, t, base[2])))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_skewed_routing_never_drops(kind):
  """Most tokens to a few experts (far past the twin's capacity, so the twin takes its
  dropless fallback): every pair still has its row and its expert output."""
  cfg, t = KINDS[kind], 512
  p, x = _params(cfg, skew=True), _tokens(cfg, t, skew=True)
  _, y_rows, pair_row, idx, w, _ = _launch(cfg, x, p)
  counts = np.bincount(np.asarray(idx).ravel(), minlength=cfg.num_experts)
  assert counts.max() > cfg.capacity(t), f"test setup: not skewed past the capacity ({counts.max()})"
  _check_pair_rows(cfg, t, idx, pair_row)
  assert_close(jnp.asarray(y_rows)[jnp.asarray(pair_row)], _pair_outputs(cfg, x, p, idx, w), BF16,
               rtol=TWIN_RTOL, what=f"{kind} skewed y_rows[pair_row]")
  y = _run(cfg, "fused", x, p)[0]
  assert_close(y, _run(cfg, "reference", x, p)[0], BF16, rtol=TWIN_RTOL, what=f"{kind} skewed fused vs twin")
  yd, _ = dense_moe(jnp.asarray(x, jnp.float32), to_f32(p), cfg)
  assert_close(y, yd, BF16, what=f"{kind} skewed fused vs dense oracle")


def _layer_grads(cfg, impl, x, p, cot, cu_cap=None):
  return layer_grads(cfg, _mesh(), x, p, cot, impl, cu_cap)


@pytest.mark.parametrize("t,rule", [(512, True), (256, False)], ids=["128_pairs_per_expert", "64"])
def test_auto_runs_the_launches_where_its_rule_holds(monkeypatch, t, rule):
  """impl=None (auto: KOSMOS_IMPL unset) on a training step of the layer: both launches
  run fused where auto's rule holds (softmax, 8 experts, top 2: t * 2 >= 128 * 8 at
  t = 512) on the Hopper builders, and neither launch below it or on other builders;
  the step's gradients are then those of impl='fused' (or 'reference'), bit for bit."""
  monkeypatch.delenv("KOSMOS_IMPL", raising=False)
  cfg = KINDS["softmax"]
  p, x, cot = _params(cfg), _tokens(cfg, t), fresh((t, cfg.hidden))
  fused = rule and _engine() == "sm90"
  ops_ = ("moe_forward", "moe_backward")
  before = {op: builder_runs()[op]["sm90"] + builder_runs()[op]["portable"] for op in ops_}
  got = jax.block_until_ready(_layer_grads(cfg, None, x, p, cot))
  ran = {op: builder_runs()[op]["sm90"] + builder_runs()[op]["portable"] - before[op] for op in ops_}
  assert ran == {op: int(fused) for op in ops_}, ran
  want = _layer_grads(cfg, "fused" if fused else "reference", x, p, cot)
  for name in want:
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), err_msg=name)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("t,skew", [(512, False), (1000, True)], ids=["balanced", "skewed"])
def test_layer_grad_fused_equals_reference(kind, t, skew):
  """jax.grad of moe_layer(impl='fused'): both directions fused (the backward's
  megakernel on the fused forward's workspace, on Hopper), every gradient against the
  twin's; skewed routing leaves experts empty and segments padded."""
  cfg = KINDS[kind]
  p, x, cot = _params(cfg, skew), _tokens(cfg, t, skew), fresh((t, cfg.hidden))
  got, want = _layer_grads(cfg, "fused", x, p, cot), _layer_grads(cfg, "reference", x, p, cot)
  for name in got:
    if name == "expert_bias":
      assert not np.any(np.asarray(got[name]))
      continue
    assert_close(got[name], want[name], BF16, what=f"{kind} d{name} fused vs reference")


@pytest.mark.parametrize("kind", ["deepseek", "llama4"])
def test_layer_grad_fused_bitwise_reproducible(kind):
  """Two fused backward runs on the same inputs give the same bits, every gradient."""
  cfg, t = KINDS[kind], 700
  p, x, cot = _params(cfg), _tokens(cfg, t), fresh((t, cfg.hidden))
  first = _layer_grads(cfg, "fused", x, p, cot)
  for _ in range(3):
    again = _layer_grads(cfg, "fused", x, p, cot)
    for name in first:
      assert np.array_equal(np.asarray(again[name], np.float32), np.asarray(first[name], np.float32)), \
          f"{kind} d{name} differs between two runs"


@pytest.mark.parametrize("cap", [1, 7])
def test_layer_grad_fused_cu_cap_same_bits(cap):
  """Both fused directions under a CU cap (a grid of 1 CTA: one CTA routes, gathers,
  builds every tile of both GEMMs' gradients and folds) give the full grid's bits."""
  cfg, t = KINDS["deepseek"], 300
  p, x, cot = _params(cfg), _tokens(cfg, t), fresh((t, cfg.hidden))
  full, capped = _layer_grads(cfg, "fused", x, p, cot), _layer_grads(cfg, "fused", x, p, cot, cu_cap=cap)
  for name in full:
    assert np.array_equal(np.asarray(capped[name], np.float32), np.asarray(full[name], np.float32)), \
        f"cu_cap={cap}: d{name} differs from the full grid's"
