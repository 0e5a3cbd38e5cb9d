"""The public kernel config (issue 23.4): every TP+SP op takes `config=` beside
`cu_cap=` and checks both on either path; the tp linears, moe_layer and the nn
modules take axis_name keyword-only plus the knobs and pass them on; tests,
scripts, benchmarks and examples reach nothing private in kosmos_jax.ops."""
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import kosmos_jax
from kosmos_jax import AgConfig, RsConfig, kernel_config, ops, reference
from kosmos_jax import nn as knn
from kosmos_jax import tp as tp_lib
from kosmos_jax.moe import moe_layer
from kosmos_jax.testing import fake_fused
from helpers import P, assert_close, mesh, put, shard_map
from moe_oracle import SOFTMAX

ROOT = pathlib.Path(__file__).resolve().parents[1]
TP = 2


def arr(*shape, seed=0):
  """The same array on every call, so a call with knobs can be compared with one
  without. (helpers.fresh draws from one counter shared by the whole session: using
  it here would change the data of every test that runs after this file.)"""
  return jnp.asarray(np.random.default_rng(seed + sum(shape)).standard_normal(shape), jnp.float32)


def moe_params(cfg):
  e, h, i = cfg.num_experts, cfg.hidden, cfg.expert_intermediate
  return {"router_w": 0.5 * arr(h, e), "gate_up": h ** -0.5 * arr(e, h, 2, i), "down": i ** -0.5 * arr(e, i, h)}


def _ag(op, **kw):
  """ops.<op> (the AG family) on small sharded operands, per device, with `kw`."""
  m = mesh(TP)
  x, w, dy = arr(2, 8, 16), arr(16, 8), arr(2, 8, 8 * TP)
  if op == "ag_tn":
    f = lambda x, w: ops.ag_tn(x, w, axis_name="tp", **kw)
    args, specs, out = (x, w), (P(None, "tp", None), P(None, "tp")), P(None, None, "tp")
  elif op == "ag_nn":
    f = lambda d, w: ops.ag_nn(d, w, axis_name="tp", **kw)
    args, specs, out = (arr(2, 8, 8), arr(16, 8)), (P(None, "tp", None), P("tp", None)), P(None, None, "tp")
  elif op == "bulk_ag_nn":
    f = lambda x, d, w: ops.bulk_ag_nn(x, d, w, axis_name="tp", **kw)[1]
    args = (x, dy, arr(16, 8 * TP))
    specs, out = (P(None, "tp", None), P(None, None, "tp"), P(None, "tp")), P(None, None, "tp")
  else:  # bulk_rs_nt
    f = lambda a, b, c: ops.bulk_rs_nt(a, b, c, axis_name="tp", **kw)[0]
    args = (arr(2, 8, 16 * TP),) * 2 + (arr(2, 8, 8 * TP),)
    specs, out = (P(None, None, "tp"),) * 3, P(None, None, "tp")
  m_args = [put(a, m, s) for a, s in zip(args, specs)]
  return jax.jit(shard_map(f, m, specs, out))(*m_args)


def _rs(**kw):
  m = mesh(TP)
  specs = (P(None, None, "tp"), P("tp", None))
  args = [put(a, m, s) for a, s in zip((arr(2, 8, 16), arr(16, 8)), specs)]
  return jax.jit(shard_map(lambda x, w: ops.tn_rs(x, w, axis_name="tp", **kw), m, specs,
                           P(None, "tp", None)))(*args)


AG_OPS = ("ag_tn", "ag_nn", "bulk_ag_nn", "bulk_rs_nt")


def test_top_level_exports_and_no_lazy_getattr():
  assert kosmos_jax.AgConfig is kernel_config.AgConfig and kosmos_jax.RsConfig is kernel_config.RsConfig
  for name in ("ops", "reference", "tp", "moe", "nn", "kernel_config", "runtime", "trace"):
    assert name in vars(kosmos_jax), name  # imported eagerly, not on first attribute access
  offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "kosmos_jax").rglob("*.py")
               if re.search(r"^def __getattr__", p.read_text(), re.M)]
  assert not offenders, f"module-level __getattr__ in {offenders}"


@pytest.mark.parametrize("op", AG_OPS)
def test_ag_family_reference_path_checks_and_ignores_config(op):
  base = _ag(op, impl="reference")
  got = _ag(op, impl="reference", cu_cap=4, config=AgConfig(movers=3, switching=False, cu_cap=4))
  assert_close(got, base, what=f"{op} with a config")
  with pytest.raises(TypeError, match=rf"{op}: config=RsConfig\(.*must be of type AgConfig"):
    _ag(op, impl="reference", config=RsConfig())
  with pytest.raises(TypeError, match=rf"{op}: config=\{{'movers': 3\}} must be of type AgConfig"):
    _ag(op, impl="reference", config={"movers": 3})
  with pytest.raises(ValueError, match=rf"{op}: cu_cap=8 conflicts with config.cu_cap=4"):
    _ag(op, impl="reference", cu_cap=8, config=AgConfig(cu_cap=4))
  with pytest.raises(ValueError, match=rf"{op}: cu_cap=0 must be a positive int"):
    _ag(op, impl="reference", cu_cap=0)


@pytest.mark.parametrize("op", ["ag_nn", "bulk_ag_nn", "bulk_rs_nt"])
def test_push_is_refused_where_the_kernel_has_none(op):
  with pytest.raises(ValueError, match=rf"{op}: config.transport='push' is not supported; only ag_tn"):
    _ag(op, impl="reference", config=AgConfig(transport="push"))


def test_tn_rs_checks_and_ignores_its_config():
  base = _rs(impl="reference")
  assert_close(_rs(impl="reference", config=RsConfig(reducers=2, stage="fp32", band_rows=8,
                                                     transport="push")), base, what="tn_rs")
  with pytest.raises(TypeError, match=r"tn_rs: config=AgConfig\(.*must be of type RsConfig"):
    _rs(impl="reference", config=AgConfig())
  with pytest.raises(ValueError, match=r"tn_rs: cu_cap=3 conflicts with config.cu_cap=5"):
    _rs(impl="reference", cu_cap=3, config=RsConfig(cu_cap=5))


def _recorders(seen):
  """Fused stand-ins that record the config each op's kernel was handed and return
  the twin's value."""
  def make(op):
    def kernel(*args, config=None, cu_cap=None, **static):
      seen.setdefault(op, []).append(config if op != "matmul" else cu_cap)
      return getattr(reference, op)(*args, **static)
    return kernel
  return {op: make(op) for op in ("ag_tn", "tn_rs", "ag_nn", "bulk_ag_nn", "bulk_rs_nt", "matmul")}


def test_fused_path_gets_the_config_with_cu_cap_merged():
  seen = {}
  with fake_fused(_recorders(seen)):
    _ag("ag_tn", impl="fused", cu_cap=6, config=AgConfig(movers=3, transport="push"))
    _ag("ag_nn", impl="fused")
    _rs(impl="fused", config=RsConfig(band_rows=4, cu_cap=9), cu_cap=9)
  assert set(seen["ag_tn"]) == {AgConfig(cu_cap=6, movers=3, transport="push")}
  assert set(seen["ag_nn"]) == {AgConfig()}  # None: the defaults, the rules pick per shape
  assert set(seen["tn_rs"]) == {RsConfig(band_rows=4, cu_cap=9)}


def _pair(kind, **kw):
  """The column or row linear under shard_map, and its sharded operands."""
  m = mesh(TP)
  if kind == "column":
    x, w = arr(2, 8, 16), arr(16, 8 * TP)
    specs, out = (P(None, "tp", None), P(None, "tp")), P(None, None, "tp")
    f = lambda x, w: tp_lib.column_parallel_linear(x, w, axis_name="tp", **kw)
  else:
    x, w = arr(2, 8, 16 * TP), arr(16 * TP, 8)
    specs, out = (P(None, None, "tp"), P("tp", None)), P(None, "tp", None)
    f = lambda x, w: tp_lib.row_parallel_linear(x, w, axis_name="tp", **kw)
  return shard_map(f, m, specs, out), [put(a, m, s) for a, s in zip((x, w), specs)]


@pytest.mark.parametrize("kind", ["column", "row"])
def test_linears_pass_each_op_its_config_forward_and_backward(kind):
  seen = {}
  ag, rs = AgConfig(movers=5, transport="push"), RsConfig(reducers=3)
  f, args = _pair(kind, impl="fused", cu_cap=7, ag_config=ag, rs_config=rs)
  with fake_fused(_recorders(seen)):
    jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2), argnums=(0, 1)))(*args)
  pulled = AgConfig(cu_cap=7, movers=5, transport="pull")  # the backward AG ops have no push
  if kind == "column":
    assert set(seen["ag_tn"]) == {AgConfig(cu_cap=7, movers=5, transport="push")}
    assert set(seen["bulk_ag_nn"]) == set(seen["bulk_rs_nt"]) == {pulled}
    assert "tn_rs" not in seen
  else:
    assert set(seen["tn_rs"]) == {RsConfig(cu_cap=7, reducers=3)}
    assert set(seen["ag_nn"]) == {pulled} and set(seen["matmul"]) == {7}


@pytest.mark.parametrize("kind", ["column", "row"])
def test_linears_check_knobs_at_entry(kind):
  f, args = _pair(kind, ag_config=AgConfig(movers=2), rs_config=RsConfig(stage="fp32"), cu_cap=4)
  ref, _ = _pair(kind)
  assert_close(jax.jit(f)(*args), jax.jit(ref)(*args), what=f"{kind} with knobs, reference path")
  name = f"{kind}_parallel_linear"
  with pytest.raises(TypeError, match=rf"{name}: rs_config=AgConfig\(.*must be of type RsConfig"):
    jax.jit(_pair(kind, rs_config=AgConfig())[0])(*args)
  with pytest.raises(TypeError, match=rf"{name}: ag_config=RsConfig\(.*must be of type AgConfig"):
    jax.jit(_pair(kind, ag_config=RsConfig())[0])(*args)
  with pytest.raises(ValueError, match=rf"{name}: cu_cap=4 conflicts with rs_config.cu_cap=2"):
    jax.jit(_pair(kind, cu_cap=4, rs_config=RsConfig(cu_cap=2))[0])(*args)


def test_axis_name_is_keyword_only():
  x, w = arr(8, 4), arr(4, 4)
  for fn in (tp_lib.column_parallel_linear, tp_lib.row_parallel_linear):
    with pytest.raises(TypeError, match="positional"):
      fn(x, w, "tp")
  with pytest.raises(TypeError, match="positional"):
    tp_lib.parallel_swiglu_mlp(x, arr(4, 2, 4), w, "tp")
  with pytest.raises(TypeError, match="positional"):
    moe_layer(arr(8, 16), moe_params(SOFTMAX), SOFTMAX, "ep")


def test_parallel_swiglu_mlp_takes_the_knobs():
  m = mesh(TP)
  x, wgu, wd = arr(2, 8, 16), 0.3 * arr(16, 2, 8), 0.3 * arr(8, 16)
  specs = (P(None, "tp", None), P(None, None, "tp"), P("tp", None))
  args = [put(a, m, s) for a, s in zip((x, wgu, wd), specs)]
  kw = dict(cu_cap=3, ag_config=AgConfig(transport="push"), rs_config=RsConfig(transport="push_fold"))
  got = jax.jit(shard_map(lambda *a: tp_lib.parallel_swiglu_mlp(*a, axis_name="tp", **kw), m, specs,
                          P(None, "tp", None)))(*args)
  want = jax.jit(shard_map(lambda *a: tp_lib.parallel_swiglu_mlp(*a, axis_name="tp"), m, specs,
                           P(None, "tp", None)))(*args)
  assert_close(got, want, what="swiglu with knobs")


def test_moe_layer_takes_and_checks_cu_cap():
  m = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("ep",))
  p = moe_params(SOFTMAX)
  names = tuple(p)
  specs = (P("ep"),) + tuple(P("ep") if n in ("gate_up", "down") else P() for n in names)

  def run(cu_cap):
    f = lambda x, *ps: moe_layer(x, dict(zip(names, ps)), SOFTMAX, axis_name="ep", cu_cap=cu_cap)
    args = [put(a, m, s) for a, s in zip((arr(16, 16), *p.values()), specs)]
    return jax.jit(jax.shard_map(f, mesh=m, in_specs=specs, out_specs=(P("ep"), P())))(*args)

  assert_close(run(4)[0], run(None)[0], what="moe_layer cu_cap on the reference path")
  with pytest.raises(ValueError, match=r"moe_forward: cu_cap=-1 must be a positive int"):
    run(-1)


def test_nn_modules_take_and_forward_the_knobs():
  m = jax.make_mesh((1, 4), ("dp", "tp"))
  kw = dict(mesh=m, cu_cap=8, ag_config=AgConfig(movers=4), rs_config=RsConfig(band_rows=2))
  x = arr(2, 8, 16)
  with jax.set_mesh(m):
    col = knn.ColumnParallelLinear(16, 32, rngs=nnx.Rngs(0), **kw)
    row = knn.RowParallelLinear(32, 16, rngs=nnx.Rngs(1), **kw)
    mlp = knn.ParallelMLP(16, 32, rngs=nnx.Rngs(2), **kw)
    assert (col.cu_cap, col.ag_config, row.rs_config) == (8, AgConfig(movers=4), RsConfig(band_rows=2))
    seen = {}
    with fake_fused(_recorders(seen)):
      for mod in (col, row, mlp):
        mod.impl = "fused"
      nnx.jit(lambda c, r, p, x: p(r(c(x))))(col, row, mlp, x)
    assert set(seen["ag_tn"]) == {AgConfig(cu_cap=8, movers=4)}  # the column linear's and the MLP's
    assert set(seen["tn_rs"]) == {RsConfig(cu_cap=8, band_rows=2)}
    with pytest.raises(TypeError, match=r"ColumnParallelLinear: ag_config=RsConfig\(.*must be of type AgConfig"):
      knn.ColumnParallelLinear(16, 32, mesh=m, ag_config=RsConfig(), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"ParallelMLP: cu_cap=8 conflicts with ag_config.cu_cap=2"):
      knn.ParallelMLP(16, 32, mesh=m, cu_cap=8, ag_config=AgConfig(cu_cap=2), rngs=nnx.Rngs(0))
    moe = knn.MoE(SOFTMAX, mesh=m, ep_axis="tp", cu_cap=8, rngs=nnx.Rngs(3))
    assert moe.cu_cap == 8
    with pytest.raises(ValueError, match=r"MoE: cu_cap=0 must be a positive int"):
      knn.MoE(SOFTMAX, mesh=m, ep_axis="tp", cu_cap=0, rngs=nnx.Rngs(3))


def test_linen_adapter_takes_the_knobs():
  m = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(1, 4), ("dp", "tp"))
  layer = knn.ParallelMLPLinen(16, 32, mesh=m, cu_cap=8, ag_config=AgConfig(movers=4),
                               rs_config=RsConfig(stage="fp32"))
  x = arr(2, 8, 16)
  variables = layer.init(jax.random.key(0), x)
  plain = knn.ParallelMLPLinen(16, 32, mesh=m)
  assert_close(jax.jit(layer.apply)(variables, x), jax.jit(plain.apply)(variables, x), what="linen knobs")


def test_no_private_ops_imports_outside_the_package():
  """Issue 23.4's acceptance: tests, scripts, benchmarks and examples use public names."""
  # Escaped dots: this file's own pattern does not match itself.
  pattern = re.compile(r"from kosmos_jax\.ops\._|from kosmos_jax\.ops import _|import kosmos_jax\.ops\._")
  hits = []
  for top in ("tests", "scripts", "benchmarks", "examples"):
    for p in sorted(q for q in (ROOT / top).rglob("*") if q.suffix in (".py", ".sh") and q.is_file()):
      for i, line in enumerate(p.read_text().splitlines(), 1):
        if pattern.search(line):
          hits.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
  assert not hits, "private kosmos_jax.ops imports:\n" + "\n".join(hits)
