"""moe_layer (reference path) against the dense per-token oracle: forward, aux loss and
all gradients, over EP = 1, 2, 4, 8; dispatch/combine round trip; determinism;
capacity overflow (fallback, never a drop); skewed routing; the dropless pass's
memory and tiling; routing statistics; Llama 4's input gating; precision; bad input."""
from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from helpers import assert_close, fresh, put, rel_err
from kosmos_jax import moe, ops
from kosmos_jax.testing import fake_fused
from kosmos_jax.reference import moe as ref_moe
from kosmos_jax.moe import MoEConfig
from moe_oracle import SPECS as moe_oracle_specs
from moe_oracle import (LLAMA4, NAMES, ROUTINGS, SOFTMAX, dense_moe, ep_mesh, make_params,
                        np_llama4_moe, place, sharded_layer, to_f32)

T = 64  # global tokens


@functools.lru_cache(maxsize=None)
def _grad_fn(cfg, ep, names, aux_w):
  """Jitted (x, cot, *params) -> (grads, (y, aux)) of the sharded layer; cached so
  repeated runs of one configuration compile once."""
  f, m = sharded_layer(cfg, ep, names)

  def loss(x, cot, *ps):
    y, aux = f(x, *ps)
    return jnp.sum(y.astype(jnp.float32) * cot) + aux_w * aux, (y, aux)

  argnums = (0, *range(2, len(names) + 2))
  return jax.jit(jax.grad(loss, argnums=argnums, has_aux=True)), m


def _grads(cfg, ep, x, p, cot, aux_w=1.0, oracle=True):
  """(y, aux, {name: grad}) of the sharded layer and of the dense oracle."""
  fn, m = _grad_fn(cfg, ep, tuple(n for n in NAMES if n in p), aux_w)
  names, xs, ps = place(m, x, p)
  g, (y, aux) = fn(xs, cot, *ps)
  got = dict(zip(("x",) + names, g))
  if not oracle:
    return (y, aux, got), None

  def oloss(x, p):
    y, aux = dense_moe(x, p, cfg)
    return jnp.sum(y * cot) + aux_w * aux, (y, aux)

  (gx, gp), (yr, auxr) = jax.grad(oloss, argnums=(0, 1), has_aux=True)(
      jnp.asarray(x, jnp.float32), to_f32(p))
  return (y, aux, got), (yr, auxr, {"x": gx, **gp})


def _compare(ours, oracle, dtype):
  (y, aux, g), (yr, auxr, gr) = ours, oracle
  assert_close(y, yr, dtype, what="y")
  assert_close(aux, auxr, dtype, what="aux loss")
  for name in g:
    if name == "expert_bias":  # selection only: never differentiated
      assert not np.any(np.asarray(g[name])), "expert_bias got a gradient"
      continue
    assert_close(g[name], gr[name], dtype, what=f"d{name}")


CASES = [  # (routing, dtype, shared expert, ep): every EP size for both routings in fp32
    *[("softmax", jnp.float32, False, ep) for ep in (1, 2, 4, 8)],
    *[("deepseek", jnp.float32, True, ep) for ep in (1, 2, 4, 8)],
    ("softmax", jnp.float32, True, 2), ("deepseek", jnp.float32, False, 4),
    ("softmax", jnp.bfloat16, True, 4), ("deepseek", jnp.bfloat16, False, 2),
    ("deepseek", jnp.bfloat16, True, 8),
    ("llama4", jnp.float32, True, 4), ("llama4", jnp.float32, False, 8),
    ("llama4", jnp.bfloat16, True, 2),
]


@pytest.mark.parametrize("routing,dtype,shared,ep", CASES,
                         ids=[f"{r}-{jnp.dtype(d).name}-{'shared' if s else 'routed'}-ep{e}"
                              for r, d, s, e in CASES])
def test_layer_and_grads_match_dense(routing, dtype, shared, ep):
  cfg = ROUTINGS[routing].replace(shared_expert_intermediate=8 if shared else 0)
  p = make_params(cfg, dtype, shared)
  x = fresh((T, cfg.hidden), dtype)
  _compare(*_grads(cfg, ep, x, p, fresh((T, cfg.hidden))), dtype)


@pytest.mark.parametrize("routing", ["softmax", "deepseek"])
def test_aux_loss_gradient_alone(routing):
  """Only the balance loss: its gradient reaches x and the router through P_i."""
  cfg = ROUTINGS[routing]
  p = make_params(cfg, jnp.float32, False)
  ours, oracle = _grads(cfg, 4, fresh((T, cfg.hidden)), p, jnp.zeros((T, cfg.hidden)), aux_w=1.0)
  assert_close(ours[2]["router_w"], oracle[2]["router_w"], jnp.float32, what="d router_w (aux)")
  assert_close(ours[2]["x"], oracle[2]["x"], jnp.float32, what="dx (aux)")
  assert float(jnp.linalg.norm(ours[2]["router_w"])) > 0


def _plan_dispatch(cfg, ep, x, idx, capacity):
  """Inside shard_map: layout, dispatched rows and the round trip fold(combine(dispatch(x)))."""
  m = ep_mesh(ep)

  def local(x, idx):
    lay = moe.plan(idx, num_experts=cfg.num_experts, capacity=capacity, axis_name="ep")
    xr = moe.dispatch(x, lay, capacity=capacity, axis_name="ep")
    back = moe.combine(xr, lay, capacity=capacity, axis_name="ep")
    ones = jnp.ones(idx.shape, jnp.float32)
    return xr, moe.fold(back, ones), lay.recv_counts[None], lay.overflow[None]

  f = jax.jit(jax.shard_map(local, mesh=m, in_specs=(P("ep"), P("ep")),
                            out_specs=(P("ep"), P("ep"), P("ep"), P("ep"))))
  return f(put(x, m, P("ep")), put(idx, m, P("ep")))


def _random_routes(t, e, k, seed):
  rng = np.random.default_rng(seed)
  return np.stack([rng.permutation(e)[:k] for _ in range(t)]).astype(np.int32)


@pytest.mark.parametrize("ep", [1, 2, 8])
def test_dispatch_layout_and_round_trip(ep):
  """Rows land expert-major, source-minor, in stable (token, slot) order; unit-weight
  combine(dispatch(x)) folds back to k * x exactly."""
  cfg, t_loc = SOFTMAX, 8
  e_l, k = cfg.num_experts // ep, cfg.top_k
  x = fresh((t_loc * ep, cfg.hidden))
  idx = _random_routes(t_loc * ep, cfg.num_experts, k, seed=ep)
  cap = t_loc
  xr, folded, recv, over = _plan_dispatch(cfg, ep, x, jnp.asarray(idx), cap)
  np.testing.assert_array_equal(np.asarray(folded), k * np.asarray(x))
  assert not np.any(np.asarray(over))
  xr = np.asarray(xr).reshape(ep, e_l, ep, cap, -1)  # [rank, local expert, source, row, h]
  xn, recv = np.asarray(x), np.asarray(recv).reshape(ep, ep, e_l)
  for r in range(ep):
    for le in range(e_l):
      for s in range(ep):
        toks = [s * t_loc + i for i in range(t_loc) for j in range(k)
                if idx[s * t_loc + i, j] == r * e_l + le]
        assert recv[r, s, le] == len(toks)
        np.testing.assert_array_equal(xr[r, le, s, :len(toks)], xn[toks])
        assert not np.any(xr[r, le, s, len(toks):]), "padding rows must be zero"


def test_bitwise_deterministic():
  cfg = ROUTINGS["deepseek"].replace(shared_expert_intermediate=8, capacity_factor=1.0)
  p = make_params(cfg, jnp.bfloat16, True)
  x, cot = fresh((T, cfg.hidden), jnp.bfloat16), fresh((T, cfg.hidden))
  a, b = (_grads(cfg, 4, x, p, cot, oracle=False)[0] for _ in range(2))
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(u, np.float32), np.asarray(v, np.float32))


def _skewed(cfg, dtype, shared=False):
  """Params and tokens that send nearly every token to expert 0 (and some to 1)."""
  p = make_params(cfg, dtype, shared)
  x = np.array(fresh((T, cfg.hidden)), np.float32)
  x[:, 0] = np.abs(x[:, 0]) + 1.0
  rw = np.array(p["router_w"], np.float32)
  # Skewed but not saturated: a saturated softmax makes its own gradient pure
  # cancellation noise in fp32, in the oracle as much as in the layer.
  rw[1:] *= 0.3
  rw[0, 0], rw[0, 1] = 3.0, 1.5
  p["router_w"] = jnp.asarray(rw, dtype)
  return p, jnp.asarray(x, dtype)


@pytest.mark.parametrize("capacity_factor,ep,expect_overflow", [
    (1.0, 4, True),    # skewed beyond capacity: dropless fallback
    (None, 4, False),  # dropless buffers: nothing can overflow
    (1.0, 8, True),
])
def test_skewed_routing_overflow_never_drops(capacity_factor, ep, expect_overflow):
  cfg = SOFTMAX.replace(capacity_factor=capacity_factor)
  p, x = _skewed(cfg, jnp.float32)
  idx = np.asarray(moe.route(x, p["router_w"], cfg).indices)
  assert np.mean(idx[:, 0] == 0) > 0.8, "test setup: routing is not skewed"
  *_, over = _plan_dispatch(cfg, ep, x, jnp.asarray(idx, jnp.int32), cfg.capacity(T // ep))
  assert bool(np.asarray(over).all()) == expect_overflow and np.asarray(over).all() == np.asarray(over).any()
  _compare(*_grads(cfg, ep, x, p, fresh((T, cfg.hidden))), jnp.float32)


def test_capped_path_without_overflow():
  """Capacity below t_local, routing within it: the padded path (no fallback) is exact."""
  cfg = SOFTMAX.replace(capacity_factor=2.0)
  p = make_params(cfg, jnp.float32, False)
  x = fresh((T * 2, cfg.hidden))
  ep, t_loc = 2, T
  assert cfg.capacity(t_loc) < t_loc
  idx = np.asarray(moe.route(x, p["router_w"], cfg).indices)
  *_, over = _plan_dispatch(cfg, ep, x, jnp.asarray(idx, jnp.int32), cfg.capacity(t_loc))
  assert not np.asarray(over).any(), "test setup: random routing overflowed capacity"
  cot = fresh((T * 2, cfg.hidden))
  _compare(*_grads(cfg, ep, x, p, cot), jnp.float32)


def _call(cfg, ep, x, p):
  f, m = sharded_layer(cfg, ep, tuple(n for n in NAMES if n in p))
  names, xs, ps = place(m, x, p)
  return f(xs, *ps)


def test_bad_input_errors():
  cfg = SOFTMAX.replace(num_experts=6, top_k=2)
  p = make_params(cfg, jnp.float32, False)
  with pytest.raises(ValueError, match=r"num_experts=6 must be divisible by the EP size ep=4"):
    p4 = dict(p, gate_up=p["gate_up"][:4], down=p["down"][:4])  # the EP check comes first
    _call(cfg, 4, fresh((T, 16)), p4)
  cfg = SOFTMAX
  p = make_params(cfg, jnp.float32, False)
  with pytest.raises(ValueError, match=r"x.shape=\(8, 12\) must be \[..., tokens, hidden=16\]"):
    moe.moe_layer(jnp.zeros((8, 12)), p, cfg, axis_name="ep")
  with pytest.raises(ValueError, match=r"gate_up.shape=\(4, 12, 2, 8\) must be \(4, 16, 2, 8\)"):
    _call(cfg, 2, fresh((T, 16)), dict(p, gate_up=fresh((8, 12, 2, 8))))
  with pytest.raises(ValueError, match=r"'w1' is now 'gate_up'"):
    moe.moe_layer(jnp.zeros((8, 16)), {"router_w": p["router_w"], "w1": p["gate_up"]}, cfg, axis_name="ep")
  with pytest.raises(ValueError, match=r"needs shared_gate_up and shared_down"):
    _call(cfg.replace(shared_expert_intermediate=8), 2, fresh((T, 16)), p)
  with pytest.raises(ValueError, match=r"axis_name='ep' is not bound"):
    from kosmos_jax import ops
    ops.moe_forward(jnp.zeros((8, 16)), p["router_w"], p["gate_up"], p["down"], config=cfg, axis_name="ep")
  with pytest.raises(ValueError, match=r"top_k=9 must be <= num_experts=8"):
    SOFTMAX.replace(top_k=9)
  with pytest.raises(ValueError, match=r"topk_groups=3 must be <= n_groups=2"):
    SOFTMAX.replace(n_groups=2, topk_groups=3)
  with pytest.raises(ValueError, match=r"capacity_factor=0.5 is too small"):
    SOFTMAX.replace(capacity_factor=0.5)


def test_fused_impl_refused_here():
  """impl='fused' never falls back silently: without a GPU (CPU CI) the dispatcher
  says why."""
  p = make_params(SOFTMAX, jnp.float32, False)
  with pytest.raises(NotImplementedError, match="moe_forward"):
    _call_impl = sharded_layer(SOFTMAX, 2, ("router_w", "gate_up", "down"), impl="fused")[0]
    names, xs, ps = place(ep_mesh(2), fresh((T, 16)), p)
    _call_impl(xs, *ps)


def _collectives(fn, *args):
  """Collectives in the lowered StableHLO (after jit's dead-code elimination)."""
  text = jax.jit(fn).lower(*args).as_text()
  return {k: len(re.findall(rf"stablehlo\.{k}\b|\"stablehlo\.{k}\"", text))
          for k in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "collective_permute")}


@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_hlo_collectives(capacity_factor):
  """Forward: the count exchange, one all-to-all each for dispatch and combine, two
  all-reduces for the aux loss inputs; with padded buffers also the overflow vote and
  the dropless fallback's own dispatch + combine. The gradient program (whose forward
  values are dead, so the aux psums go) adds per pass the dispatch of dY and the
  combine of dX (the dropless pass also re-dispatches X to rematerialize), and psums
  of the counts (aux gradient) and of the replicated router's weight gradient."""
  cfg = SOFTMAX.replace(capacity_factor=capacity_factor)
  p = make_params(cfg, jnp.float32, False)
  f, m = sharded_layer(cfg, 4, ("router_w", "gate_up", "down"))
  _, xs, ps = place(m, fresh((T, cfg.hidden)), p)

  def loss(x, *ps):
    y, aux = f(x, *ps)
    return jnp.sum(y) + aux

  fwd, bwd = _collectives(f, xs, *ps), _collectives(jax.grad(loss, argnums=(0, 1, 2, 3)), xs, *ps)
  padded = capacity_factor is not None
  zero = dict(all_gather=0, reduce_scatter=0, collective_permute=0)
  assert fwd == zero | dict(all_to_all=1 + 2 + 2 if padded else 1 + 2,
                            all_reduce=1 + 2 if padded else 2)
  assert bwd == zero | dict(all_to_all=5 + 2 + 3 if padded else 3 + 3,
                            all_reduce=1 + 2 if padded else 2)


@pytest.mark.parametrize("capacity_factor,ep", [(2.0, 1), (2.0, 4), (None, 2), (1.0, 8)])
def test_llama4_input_gating_matches_per_token_oracle(capacity_factor, ep):
  """Issue 24.5: each routed expert's *input* is scaled by its sigmoid score and the
  outputs are summed unweighted (Llama4TextMoe), checked against a per-token NumPy
  loop; the output-gated layer on the same weights is measurably different."""
  cfg = LLAMA4.replace(capacity_factor=capacity_factor)
  p = make_params(cfg, jnp.float32, True)
  x = fresh((T, cfg.hidden))
  y, aux = _call(cfg, ep, x, p)
  want = np_llama4_moe(x, p, cfg)
  assert_close(y, want, jnp.float32, what="y vs per-token Llama 4 oracle")
  assert float(aux) == 0.0
  y_out, _ = _call(cfg.replace(gating="output"), ep, x, p)
  assert rel_err(y_out, want) > 1e-3, "test setup: the two gatings agree on these weights"


def test_llama4_input_gating_overflow_grads():
  """Input gating through the dropless fallback (skewed top-1 routing), with grads."""
  cfg = LLAMA4.replace(capacity_factor=1.0)
  p, x = _skewed(cfg, jnp.float32, shared=True)
  assert bool(_stats(cfg, 4, x, p).dropless_fallback), "test setup: no overflow"
  _compare(*_grads(cfg, 4, x, p, fresh((T, cfg.hidden))), jnp.float32)
  assert_close(_call(cfg, 4, x, p)[0], np_llama4_moe(x, p, cfg), jnp.float32, what="y")


def _stats(cfg, ep, x, p):
  f, m = sharded_layer(cfg, ep, tuple(n for n in NAMES if n in p), stats=True)
  names, xs, ps = place(m, x, p)
  return f(xs, *ps)[2]


@pytest.mark.parametrize("skewed", [False, True])
def test_routing_stats(skewed):
  """Issue 24.4: per-expert counts, max load, capacity fill and whether the dropless
  fallback ran, against the router's choices counted in NumPy."""
  # Unskewed: 16 tokens per rank, 2 of 8 experts each, so 4 rows per (rank, expert) on
  # average. Some count passes a capacity of 12 (factor 3) in ~1e-4 of random draws;
  # it passed 8 (factor 2) in ~1 of 5, so the test failed on some draws (seeds shift
  # with the tests that run before it).
  cfg, ep = SOFTMAX.replace(capacity_factor=3.0 if not skewed else 1.0), 4
  p, x = _skewed(cfg, jnp.float32) if skewed else (make_params(cfg, jnp.float32, False),
                                                   fresh((T, cfg.hidden)))
  st = _stats(cfg, ep, x, p)
  idx = np.asarray(moe.route(x, p["router_w"], cfg).indices)
  counts = np.bincount(idx.ravel(), minlength=cfg.num_experts)
  np.testing.assert_array_equal(np.asarray(st.expert_counts), counts)
  assert np.isclose(float(st.max_load), counts.max() / counts.mean())
  t_loc, e_l = T // ep, cfg.num_experts // ep
  per = [np.bincount(idx[r * t_loc:(r + 1) * t_loc].ravel(), minlength=cfg.num_experts)
         for r in range(ep)]  # rows rank r sends to each expert
  fill = max(c.max() for c in per) / cfg.capacity(t_loc)
  assert np.isclose(float(st.capacity_fill), fill)
  assert bool(st.dropless_fallback) == (fill > 1) == skewed
  assert e_l * ep == cfg.num_experts


def _grad_temp_bytes(num_experts, t, k=2):
  """Scratch bytes XLA allots to the layer's forward + backward on one device, with
  capped buffers whose fallback is compiled in (lax.cond keeps both passes)."""
  cfg = MoEConfig(num_experts=num_experts, top_k=k, hidden=32, expert_intermediate=16,
                  capacity_factor=1.0)
  f, _ = sharded_layer(cfg, 1, ("router_w", "gate_up", "down"))

  def loss(x, *ps):
    y, aux = f(x, *ps)
    return jnp.sum(y) + aux

  shapes = [(t, 32), (32, num_experts), (num_experts, 32, 2, 16), (num_experts, 16, 32)]
  args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(*args)
  return lowered.compile().memory_analysis().temp_size_in_bytes


def test_dropless_memory_grows_with_pairs_not_experts():
  """Issue 24.4: the fallback's buffers held experts x tokens rows (E/k times the pairs
  routed). At fixed tokens and k, 8x the experts must not multiply the scratch memory
  (it did by ~7x before); 4x the tokens grows it about 4x."""
  small, many = _grad_temp_bytes(8, 1024), _grad_temp_bytes(64, 1024)
  assert many < 1.5 * small, (small, many)
  assert _grad_temp_bytes(8, 4096) < 5 * small


@pytest.mark.parametrize("capacity_factor,ep", [(1.0, 4), (None, 2), (None, 1)])
def test_dropless_pass_small_tiles(monkeypatch, capacity_factor, ep):
  """Tiles of 2 and 3 rows: experts span many tiles and their tiles overlap the next
  expert's rows, which must neither be overwritten nor reach the wrong weights."""
  cfg = ROUTINGS["deepseek"].replace(capacity_factor=capacity_factor)
  for tile in (2, 3):
    monkeypatch.setattr(ref_moe, "TILE_ROWS", tile)
    p = make_params(cfg, jnp.float32, False)
    x = fresh((T, cfg.hidden))
    f, m = sharded_layer(cfg, ep, tuple(n for n in NAMES if n in p))  # traced afresh: new tile
    names, xs, ps = place(m, x, p)
    fn = jax.jit(jax.grad(lambda x, *ps: jnp.sum(f(x, *ps)[0] ** 2), argnums=(0, 2, 3)))
    g = dict(zip(("x", "gate_up", "down"), fn(xs, *ps)))
    gr = jax.grad(lambda x, p: jnp.sum(dense_moe(x, p, cfg)[0] ** 2), argnums=(0, 1))(x, to_f32(p))
    for n in g:
      assert_close(g[n], gr[0] if n == "x" else gr[1][n], jnp.float32, what=f"d{n} tile {tile}")


def test_precision_reaches_every_dot():
  """precision=HIGHEST is on every dot of the forward and backward (router included)."""
  cfg = ROUTINGS["deepseek"].replace(shared_expert_intermediate=8)
  p = make_params(cfg, jnp.float32, True)
  names = tuple(n for n in NAMES if n in p)
  m = ep_mesh(2)
  hi = jax.lax.Precision.HIGHEST

  def local(x, *ps):
    y, aux = moe.moe_layer(x, dict(zip(names, ps)), cfg, axis_name="ep", precision=hi)
    return jnp.sum(y) + aux

  specs = (P("ep"), *[moe_oracle_specs[n] for n in names])
  f = jax.shard_map(jax.grad(local, argnums=(0, 1, 2, 3)), mesh=m, in_specs=specs,
                    out_specs=(P("ep"), P(), P("ep"), P("ep")))
  _, xs, ps = place(m, fresh((T, cfg.hidden)), p)
  text = jax.jit(f).lower(xs, *ps).as_text()
  dots = re.findall(r"stablehlo.dot_general.*", text)
  assert len(dots) >= 12, len(dots)
  assert all("HIGHEST" in d for d in dots), [d for d in dots if "HIGHEST" not in d][:2]


def test_fused_path_refuses_a_precision():
  """A fused kernel has its own precision: asking for another is an error, not ignored."""
  p = make_params(SOFTMAX, jnp.float32, False)
  m = ep_mesh(2)

  def local(x, *ps):
    return ops.moe_forward(x, *ps, config=SOFTMAX, axis_name="ep", impl="fused",
                           precision=jax.lax.Precision.HIGHEST)[0]

  f = jax.shard_map(local, mesh=m, in_specs=(P("ep"), P(), P("ep"), P("ep")), out_specs=P("ep"))
  names, xs, ps = place(m, fresh((T, 16)), p)
  with fake_fused({"moe_forward": lambda *a, **k: None}):
    with pytest.raises(ValueError, match=r"moe_forward: precision=.*HIGHEST.* cannot be honoured"):
      jax.jit(f).lower(xs, *ps)


def test_aux_loss_exactly_zero_with_a_nan_token():
  """Issue 24.6, through the layer: aux_loss_coeff=0 gives exactly 0 with a NaN token."""
  cfg = SOFTMAX.replace(aux_loss_coeff=0.0)
  p = make_params(cfg, jnp.float32, False)
  x = np.array(fresh((T, cfg.hidden)))
  x[5] = np.nan
  _, aux = _call(cfg, 2, jnp.asarray(x), p)
  assert float(aux) == 0.0
