"""route() against a direct NumPy transcription of each routing rule; tie-breaking;
the aux loss; MoEConfig validation and presets."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_close, fresh
from kosmos_jax import moe
from kosmos_jax.moe import MoEConfig
from moe_oracle import DEEPSEEK, SOFTMAX, np_route

RULES = {
    "softmax": SOFTMAX,
    "softmax-normalized": SOFTMAX.replace(norm_topk_prob=True, top_k=3),
    "softmax-grouped": SOFTMAX.replace(n_groups=4, topk_groups=2, top_k=3),
    "deepseek": DEEPSEEK,
    "sigmoid-top1": SOFTMAX.replace(score="sigmoid", top_k=1),  # Llama 4's gate
    "sigmoid-bias-scaled": DEEPSEEK.replace(n_groups=1, topk_groups=1, norm_topk_prob=False),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_route_matches_numpy(rule):
  cfg = RULES[rule]
  x, rw = fresh((48, cfg.hidden)), fresh((cfg.hidden, cfg.num_experts), scale=0.5)
  bias = fresh((cfg.num_experts,), scale=0.1) if cfg.use_expert_bias else None
  r = moe.route(x, rw, cfg, bias)
  idx, w, logits = np_route(x, rw, cfg, bias)
  np.testing.assert_array_equal(np.asarray(r.indices), idx)
  assert r.weights.dtype == jnp.float32 and r.logits.dtype == jnp.float32
  assert_close(r.weights, w, jnp.float32, what="weights")
  assert_close(r.logits, logits, jnp.float32, what="logits")
  np.testing.assert_array_equal(np.asarray(r.counts), np.bincount(idx.ravel(), minlength=cfg.num_experts))


def test_route_bf16_logits_are_fp32():
  cfg = RULES["deepseek"]
  x, rw = fresh((32, cfg.hidden), jnp.bfloat16), fresh((cfg.hidden, cfg.num_experts), jnp.bfloat16, 0.5)
  bias = fresh((cfg.num_experts,), scale=0.1)
  r = moe.route(x, rw, cfg, bias)
  idx, w, _ = np_route(np.asarray(x, np.float32), np.asarray(rw, np.float32), cfg, bias)
  assert r.logits.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(r.indices), idx)
  assert_close(r.weights, w, jnp.float32, what="weights")


@pytest.mark.parametrize("rule", ["softmax", "deepseek"])
def test_ties_go_to_lower_expert_id(rule):
  """Identical router columns give exactly equal scores: the lower id must win, for
  experts and (DeepSeek) for groups."""
  cfg = RULES[rule]
  col = np.asarray(fresh((cfg.hidden, 1), scale=0.5))
  rw = jnp.asarray(np.repeat(col, cfg.num_experts, axis=1))  # every expert ties
  x = fresh((16, cfg.hidden))
  bias = jnp.zeros((cfg.num_experts,)) if cfg.use_expert_bias else None
  r = moe.route(x, rw, cfg, bias)
  want = np.tile(np.arange(cfg.top_k), (16, 1))
  np.testing.assert_array_equal(np.asarray(r.indices), want)
  np.testing.assert_array_equal(np.asarray(r.indices), np_route(x, rw, cfg, bias)[0])
  # A partial tie: experts 3 and 5 share the best column, the rest are worse.
  rw = np.array(np.repeat(col, cfg.num_experts, axis=1)) * 0.0
  rw[:, 3] = rw[:, 5] = np.abs(col[:, 0]) + 1.0
  x = jnp.abs(fresh((16, cfg.hidden)))
  r = moe.route(x, jnp.asarray(rw), cfg, bias)
  np.testing.assert_array_equal(np.asarray(r.indices)[:, :2], np.tile([3, 5], (16, 1)))


def test_bias_steers_selection_not_weights():
  cfg = DEEPSEEK.replace(n_groups=1, topk_groups=1)
  x, rw = fresh((16, cfg.hidden)), fresh((cfg.hidden, cfg.num_experts), scale=0.5)
  bias = np.zeros(cfg.num_experts, np.float32)
  bias[7] = 10.0  # forces expert 7 into every token's top-k
  r = moe.route(x, rw, cfg, jnp.asarray(bias))
  assert np.all(np.any(np.asarray(r.indices) == 7, axis=1))
  s = 1 / (1 + np.exp(-np.asarray(r.logits, np.float64)))
  chosen = np.take_along_axis(s, np.asarray(r.indices), 1)
  assert_close(r.weights, chosen / chosen.sum(1, keepdims=True) * cfg.route_scale, jnp.float32)


@pytest.mark.parametrize("rule", ["softmax", "deepseek"])
def test_aux_loss_formula(rule):
  cfg = RULES[rule]
  x, rw = fresh((40, cfg.hidden)), fresh((cfg.hidden, cfg.num_experts), scale=0.5)
  bias = fresh((cfg.num_experts,), scale=0.1) if cfg.use_expert_bias else None
  r = moe.route(x, rw, cfg, bias)
  idx, _, logits = np_route(x, rw, cfg, bias)
  if cfg.score == "softmax":
    p = np.exp(logits - logits.max(1, keepdims=True))
  else:
    p = 1 / (1 + np.exp(-logits))
  p = p / p.sum(1, keepdims=True)
  f = np.bincount(idx.ravel(), minlength=cfg.num_experts) / (40 * cfg.top_k)
  want = cfg.aux_loss_coeff * cfg.num_experts * np.sum(f * p.mean(0))
  assert_close(moe.aux_loss(r, cfg), want, jnp.float32, what="aux loss")


def test_route_bad_input():
  with pytest.raises(ValueError, match=r"x.shape=\(4, 12\).*hidden=16"):
    moe.route(jnp.zeros((4, 12)), jnp.zeros((12, 8)), SOFTMAX)
  with pytest.raises(ValueError, match=r"router_w.shape\[1\]=6 must equal num_experts=8"):
    moe.route(jnp.zeros((4, 16)), jnp.zeros((16, 6)), SOFTMAX)
  with pytest.raises(ValueError, match=r"use_expert_bias=True needs bias"):
    moe.route(jnp.zeros((4, 16)), jnp.zeros((16, 16)), DEEPSEEK)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(top_k=9), r"top_k=9 must be <= num_experts=8"),
    (dict(n_groups=2, topk_groups=3), r"topk_groups=3 must be <= n_groups=2"),
    (dict(n_groups=3), r"num_experts=8 must be divisible by n_groups=3"),
    (dict(n_groups=8), r"needs >= 2 experts per group"),
    (dict(n_groups=4, topk_groups=1, top_k=3), r"top_k=3 exceeds the experts eligible"),
    (dict(score="relu"), r"score='relu' must be one of"),
    (dict(capacity_factor=0.5), r"capacity_factor=0.5 is too small"),
    (dict(hidden=0), r"hidden=0 must be a positive int"),
    (dict(route_scale=-1.0), r"route_scale=-1.0"),
    (dict(shared_expert_intermediate=-2), r"shared_expert_intermediate=-2"),
])
def test_config_validation(kwargs, msg):
  with pytest.raises(ValueError, match=msg):
    SOFTMAX.replace(**kwargs)


def test_capacity():
  cfg = SOFTMAX.replace(capacity_factor=1.25)  # E=8, k=2
  assert cfg.capacity(64) == 20          # ceil(1.25 * 64 * 2 / 8)
  assert cfg.capacity(3) == 1
  assert cfg.replace(capacity_factor=100.0).capacity(16) == 16  # never beyond t_local
  assert cfg.replace(capacity_factor=None).capacity(16) == 16


def test_presets_construct_and_route():
  want = {  # (hidden, expert width, experts, top-k, shared width), from the cited configs
      "deepseek-v3": (7168, 2048, 256, 8, 2048), "qwen3-235b-a22b": (4096, 1536, 128, 8, 0),
      "qwen3-30b-a3b": (2048, 768, 128, 8, 0), "llama4-scout": (5120, 8192, 16, 1, 8192),
      "llama4-maverick": (5120, 8192, 128, 1, 8192)}
  for name, cfg in moe.PRESETS.items():
    assert (cfg.hidden, cfg.expert_intermediate, cfg.num_experts, cfg.top_k,
            cfg.shared_expert_intermediate) == want[name], name
  ds = moe.DEEPSEEK_V3
  assert (ds.score, ds.n_groups, ds.topk_groups, ds.route_scale, ds.use_expert_bias,
          ds.norm_topk_prob) == ("sigmoid", 8, 4, 2.5, True, True)
  assert moe.QWEN3_235B_A22B.score == "softmax" and moe.QWEN3_235B_A22B.norm_topk_prob
  # The DeepSeek-V3 group-limited rule at its real expert count, small width.
  cfg = ds.replace(hidden=32)
  x, rw = fresh((8, 32)), fresh((32, 256), scale=0.3)
  bias = fresh((256,), scale=0.05)
  r = moe.route(x, rw, cfg, bias)
  np.testing.assert_array_equal(np.asarray(r.indices), np_route(x, rw, cfg, bias)[0])
  groups = np.asarray(r.indices) // 32
  assert all(len(set(g)) <= 4 for g in groups)


@pytest.mark.parametrize("kwargs,err,msg", [
    (dict(capacity_factor=float("inf")), ValueError, r"capacity_factor=inf must be finite"),
    (dict(capacity_factor=float("nan")), ValueError, r"capacity_factor=nan must be finite"),
    (dict(capacity_factor="2"), TypeError, r"capacity_factor='2' must be a real number or None"),
    (dict(route_scale=float("inf")), ValueError, r"route_scale=inf must be finite"),
    (dict(aux_loss_coeff=float("nan")), ValueError, r"aux_loss_coeff=nan must be finite"),
    (dict(aux_loss_coeff="0.1"), TypeError, r"aux_loss_coeff='0.1' must be a real number"),
    (dict(num_experts="8"), TypeError, r"num_experts='8' must be an int"),
    (dict(top_k=2.0), TypeError, r"top_k=2.0 must be an int"),
    (dict(hidden=True), TypeError, r"hidden=True must be an int"),
    (dict(norm_topk_prob=1), TypeError, r"norm_topk_prob=1 must be a bool"),
    (dict(gating="gate"), ValueError, r"gating='gate' must be one of \('output', 'input'\)"),
])
def test_config_types_and_finiteness(kwargs, err, msg):
  """Issue 24.3: inf was accepted (OverflowError on the first call); '2' and nan were
  reported as 'too small'."""
  with pytest.raises(err, match=msg):
    SOFTMAX.replace(**kwargs)


def test_config_normalizes_numpy_numbers():
  cfg = SOFTMAX.replace(num_experts=np.int64(8), capacity_factor=np.float32(1.5), route_scale=2)
  assert type(cfg.num_experts) is int and type(cfg.capacity_factor) is float
  assert type(cfg.route_scale) is float
  assert cfg == SOFTMAX.replace(capacity_factor=1.5, route_scale=2.0)
  assert hash(cfg) == hash(SOFTMAX.replace(capacity_factor=1.5, route_scale=2.0))


def test_aux_loss_is_exactly_zero_without_coeff():
  """Issue 24.6: one NaN token made the aux loss NaN even with aux_loss_coeff=0."""
  cfg = SOFTMAX.replace(aux_loss_coeff=0.0)
  x = np.array(fresh((16, cfg.hidden)))
  x[3] = np.nan
  r = moe.route(jnp.asarray(x), fresh((cfg.hidden, cfg.num_experts)), cfg)
  aux = moe.aux_loss(r, cfg)
  assert aux.dtype == jnp.float32 and float(aux) == 0.0
  assert np.isnan(float(moe.aux_loss(r, cfg.replace(aux_loss_coeff=0.1))))  # with a coeff, NaN shows


def test_llama4_presets_gate_the_expert_input():
  """Issue 24.5: Llama4TextMoe scales each routed expert's input by its sigmoid score."""
  for cfg in (moe.LLAMA4_SCOUT, moe.LLAMA4_MAVERICK):
    assert (cfg.gating, cfg.score, cfg.top_k, cfg.norm_topk_prob, cfg.route_scale) == (
        "input", "sigmoid", 1, False, 1.0)
  for cfg in (moe.DEEPSEEK_V3, moe.QWEN3_235B_A22B, moe.QWEN3_30B_A3B):
    assert cfg.gating == "output"
