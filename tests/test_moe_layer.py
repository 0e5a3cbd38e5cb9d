"""moe_layer (reference path) against the dense per-token oracle: forward, aux loss and
all gradients, over EP = 1, 2, 4, 8; dispatch/combine round trip; determinism;
capacity overflow (fallback, never a drop); skewed routing; bad input."""
from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from helpers import assert_close, fresh, put
from kosmos_jax import moe
from moe_oracle import (NAMES, ROUTINGS, SOFTMAX, dense_moe, ep_mesh, make_params, place,
                        sharded_layer, to_f32)

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


def _skewed(cfg, dtype):
  """Params and tokens that send nearly every token to expert 0 (and some to 1)."""
  p = make_params(cfg, dtype, False)
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
    p4 = dict(p, w1=p["w1"][:4], w2=p["w2"][:4])  # shapes irrelevant: the EP check comes first
    _call(cfg, 4, fresh((T, 16)), p4)
  cfg = SOFTMAX
  p = make_params(cfg, jnp.float32, False)
  with pytest.raises(ValueError, match=r"x.shape=\(8, 12\) must be \[..., tokens, hidden=16\]"):
    moe.moe_layer(jnp.zeros((8, 12)), p, cfg, "ep")
  with pytest.raises(ValueError, match=r"w1.shape=\(4, 12, 16\) must be \(4, 16, 16\)"):
    _call(cfg, 2, fresh((T, 16)), dict(p, w1=fresh((8, 12, 16))))
  with pytest.raises(ValueError, match=r"needs shared_w1 and shared_w2"):
    _call(cfg.replace(shared_expert_intermediate=8), 2, fresh((T, 16)), p)
  with pytest.raises(ValueError, match=r"axis_name='ep' is not bound"):
    from kosmos_jax import ops
    ops.moe_forward(jnp.zeros((8, 16)), p["router_w"], p["w1"], p["w2"], config=cfg, axis_name="ep")
  with pytest.raises(ValueError, match=r"top_k=9 must be <= num_experts=8"):
    SOFTMAX.replace(top_k=9)
  with pytest.raises(ValueError, match=r"topk_groups=3 must be <= n_groups=2"):
    SOFTMAX.replace(n_groups=2, topk_groups=3)
  with pytest.raises(ValueError, match=r"capacity_factor=0.5 is too small"):
    SOFTMAX.replace(capacity_factor=0.5)


def test_fused_impl_not_available_yet():
  p = make_params(SOFTMAX, jnp.float32, False)
  with pytest.raises(NotImplementedError, match="moe_forward"):
    _call_impl = sharded_layer(SOFTMAX, 2, ("router_w", "w1", "w2"), impl="fused")[0]
    names, xs, ps = place(ep_mesh(2), fresh((T, 16)), p)
    _call_impl(xs, *ps)


def _collectives(fn, *args):
  """Collectives in the lowered StableHLO (after jit's dead-code elimination)."""
  text = jax.jit(fn).lower(*args).as_text()
  return {k: len(re.findall(rf"stablehlo\.{k}\b|\"stablehlo\.{k}\"", text))
          for k in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "collective_permute")}


@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_hlo_collectives(capacity_factor):
  """Forward: one all-to-all each for dispatch and combine, two all-reduces for the aux
  loss inputs; with padded buffers also the count exchange, the overflow vote and the
  fallback's own dispatch + combine. The gradient program (whose forward values are
  dead, so the aux psums go) has dispatch of dY and combine of dX per branch (the
  fallback re-dispatches X to rematerialize), and psums of the counts (aux gradient)
  and of the replicated router's weight gradient."""
  cfg = SOFTMAX.replace(capacity_factor=capacity_factor)
  p = make_params(cfg, jnp.float32, False)
  f, m = sharded_layer(cfg, 4, ("router_w", "w1", "w2"))
  _, xs, ps = place(m, fresh((T, cfg.hidden)), p)

  def loss(x, *ps):
    y, aux = f(x, *ps)
    return jnp.sum(y) + aux

  fwd, bwd = _collectives(f, xs, *ps), _collectives(jax.grad(loss, argnums=(0, 1, 2, 3)), xs, *ps)
  padded = capacity_factor is not None
  zero = dict(all_gather=0, reduce_scatter=0, collective_permute=0)
  assert fwd == zero | dict(all_to_all=5 if padded else 2, all_reduce=3 if padded else 2)
  assert bwd == zero | dict(all_to_all=5 + 2 + 3 if padded else 2 + 2,
                            all_reduce=1 + 2 if padded else 2)
