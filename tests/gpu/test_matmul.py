"""Standalone GEMM (kosmos_matmul) on one GPU, each layout against its reference twin
computed in fp32 at HIGHEST precision (XLA's GPU default for f32 is TF32). Outputs
are poisoned with NaN before every launch (tests/gpu/conftest.py), so an unwritten
element fails. Which engine ran is read from the extension's launch counters."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kosmos_jax import ops, reference
from kosmos_jax.testing import engine_runs
from helpers import P, assert_close, fresh, put, shard_map

SM90 = ("sm90_128x256", "sm90_128x128", "sm90_128x192")


def _gpu():
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  if not gpus:
    pytest.skip("no GPU visible to JAX")
  return gpus[0]


def _operands(layout, batch, m, k, n, dtype):
  """Fresh operands in ops.matmul's terms (see kosmos_jax/reference/matmul.py)."""
  a = fresh((*batch, m, n if layout == "NN" else k), dtype)
  b = fresh((*batch, m, n) if layout == "NT" else (k, n), dtype)
  return jax.device_put(a, _gpu()), jax.device_put(b, _gpu())


def _twin_f32(a, b, layout):
  with jax.default_matmul_precision("highest"):
    return reference.matmul(a.astype(jnp.float32), b.astype(jnp.float32), layout=layout)


def _expected_engines(layout, k, n, dtype):
  """sm90 for bf16 on cc 9.0 when TMA can describe the operands, else portable."""
  hopper = getattr(_gpu(), "compute_capability", "") == "9.0"
  aligned = n % 8 == 0 and (layout == "NN" or k % 8 == 0)  # leading dims (tile_choice.h: unsupported)
  return SM90 if (hopper and aligned and dtype == jnp.bfloat16) else ("portable",)


def _run(a, b, layout, **kw):
  before = engine_runs()
  y = jax.block_until_ready(ops.matmul(a, b, layout=layout, impl="fused", **kw))
  after = engine_runs()
  ran = tuple(e for e in after if after[e] != before[e])
  return y, ran


def _check(layout, batch, m, k, n, dtype, cu_cap=None):
  a, b = _operands(layout, batch, m, k, n, dtype)
  y, ran = _run(a, b, layout, cu_cap=cu_cap)
  ref = _twin_f32(a, b, layout)
  assert y.dtype == a.dtype and y.shape == ref.shape, (y.dtype, y.shape, ref.shape)
  what = f"{layout} batch={batch} m={m} k={k} n={n} {jnp.dtype(dtype)} cu_cap={cu_cap} engine={ran}"
  assert len(ran) == 1 and ran[0] in _expected_engines(layout, k, n, dtype), what
  assert_close(y, ref, dtype, what=what)
  return a, b, y


LAYOUTS = ("TN", "NN", "NT")
CASES = [  # (batch, m, k, n, dtype): none a multiple of the 128x256 / 128x128 tiles
    ((2,), 300, 520, 776, jnp.bfloat16),   # aligned leading dims: Hopper engine
    ((), 1000, 1032, 1288, jnp.bfloat16),  # several tiles each way
    ((), 77, 129, 131, jnp.bfloat16),      # leading dims not multiples of 8: portable engine
    ((), 300, 130, 264, jnp.bfloat16),     # NN: Hopper engine, 130 output columns: its register-store epilogue
    ((3,), 130, 72, 200, jnp.float32),     # fp32: portable engine, 1e-5
    ((), 99, 40, 136, jnp.float16),
    ((), 5, 8, 16, jnp.bfloat16),          # smaller than one tile
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}x{c[3]}-{jnp.dtype(c[4])}")
def test_matmul_vs_twin(layout, case):
  _check(layout, *case)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cu_cap", [1, 7, 66])
def test_cu_cap(layout, cu_cap):
  # Many tiles (4096 x 2048 output: 256 of 128x256) on few CTAs: every CTA loops.
  _check(layout, (), 4096 if layout != "NT" else 1024, 1024 if layout != "NT" else 4096, 2048, jnp.bfloat16,
         cu_cap=cu_cap)
  _check(layout, (), 333, 129, 301, jnp.float32, cu_cap=cu_cap)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_back_to_back_and_deterministic(layout):
  """Several launches queued without a sync, each on fresh inputs, then checked;
  the same inputs twice give the same bits (one completion point per tile)."""
  f = jax.jit(lambda a, b: ops.matmul(a, b, layout=layout, impl="fused"))
  ins = [_operands(layout, (2,), 640, 1024, 768, jnp.bfloat16) for _ in range(6)]
  outs = [f(a, b) for a, b in ins]
  again = f(*ins[0])
  for i, ((a, b), y) in enumerate(zip(ins, outs)):
    assert_close(y, _twin_f32(a, b, layout), jnp.bfloat16, what=f"{layout} call {i}")
  np.testing.assert_array_equal(np.asarray(again.astype(jnp.float32)), np.asarray(outs[0].astype(jnp.float32)))


def test_large_multi_wave():
  """4096 x 4096 output at k = 2048: 512 tiles of 128x256, four waves on 132 SMs."""
  for layout in LAYOUTS:
    _check(layout, (), 4096, 2048 if layout != "NT" else 4096, 4096, jnp.bfloat16)


# (layout, m, k, n) in ops.matmul's terms whose engine problem is 8192 x 768 (or
# 768 x 4096 for NT): 8B-QKV's thin output, where choose_tile picks 128x192.
THIN = [("TN", 8192, 192, 768), ("NN", 8192, 768, 192), ("NT", 192, 768, 4096)]


@pytest.mark.parametrize("layout,m,k,n", THIN)
def test_thin_output_runs_128x192(layout, m, k, n):
  a, b = _operands(layout, (), m, k, n, jnp.bfloat16)
  y, ran = _run(a, b, layout)
  if getattr(_gpu(), "compute_capability", "") != "9.0":
    pytest.skip("128x192 is a Hopper engine shape")
  # The wave model's pick depends on the SM count; 132 is the H100/H200 SXM's.
  want = ("sm90_128x192",) if getattr(_gpu(), "core_count", 132) == 132 else SM90
  assert len(ran) == 1 and ran[0] in want, (ran, want)
  assert_close(y, _twin_f32(a, b, layout), jnp.bfloat16, what=f"{layout} thin output")


def test_inside_shard_map():
  """Per-device call under shard_map over every GPU (rows sharded, b replicated)."""
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  mesh = jax.sharding.Mesh(np.array(gpus), ("x",))
  a = fresh((len(gpus) * 2, 264, 512), jnp.bfloat16)
  b = fresh((512, 392), jnp.bfloat16)
  f = shard_map(lambda a, b: ops.matmul(a, b, layout="TN", impl="fused"), mesh,
                in_specs=(P("x"), P()), out_specs=P("x"))
  y = f(put(a, mesh, P("x")), put(b, mesh, P()))
  assert_close(y, _twin_f32(a, b, "TN"), jnp.bfloat16, what="TN in shard_map")


# A fresh interpreter per check: KOSMOS_SM90_TILE is read once per process.
_CHILD = """
import json, sys
import jax, jax.numpy as jnp
from kosmos_jax import ops, reference
from kosmos_jax.testing import engine_runs
errs = []
for i, (layout, sa, sb, *cap) in enumerate(json.loads(sys.argv[1])):
  a = jax.random.normal(jax.random.key(i), tuple(sa), jnp.float32).astype(jnp.bfloat16)
  b = jax.random.normal(jax.random.key(100 + i), tuple(sb), jnp.float32).astype(jnp.bfloat16)
  y = ops.matmul(a, b, layout=layout, impl='fused', cu_cap=cap[0] if cap else None).astype(jnp.float32)
  with jax.default_matmul_precision('highest'):
    ref = reference.matmul(a.astype(jnp.float32), b.astype(jnp.float32), layout=layout)
  errs.append(float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref)))
print('RESULT', json.dumps({'runs': {k: v for k, v in engine_runs().items() if v}, 'errs': errs}))
"""


def _in_child(tile, problems):
  """ops.matmul on `problems` [(layout, a_shape, b_shape[, cu_cap])] in a fresh interpreter under
  KOSMOS_SM90_TILE=tile ("": unset), outputs poisoned; returns (the process, its result or None).
  An unwritten element makes its error NaN, which fails every `< tol` check."""
  import json
  import os
  import subprocess
  import sys
  env = dict(os.environ, KOSMOS_POISON_OUTPUT="1")
  env.pop("KOSMOS_SM90_TILE", None)
  if tile:
    env["KOSMOS_SM90_TILE"] = tile
  r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(problems)], env=env, capture_output=True, text=True,
                     timeout=300)
  lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
  return r, (json.loads(lines[-1][len("RESULT "):]) if r.returncode == 0 and lines else None)


def test_forced_tile_shape():
  """KOSMOS_SM90_TILE forces the Hopper tile shape: a problem the wave model gives
  128x256 runs 128x128; a name that is no tile shape fails the call, naming the
  valid ones, and so does the retired 2-CTA cluster shape's."""
  if getattr(_gpu(), "compute_capability", "") != "9.0":
    pytest.skip("tile shapes are the Hopper engine's")
  problem = [("TN", (4096, 512), (512, 4096))]
  r, out = _in_child("128x128", problem)
  assert out is not None, r.stderr[-3000:]
  assert out["runs"] == {"sm90_128x128": 1} and out["errs"][0] < 1e-2, out
  bad, out = _in_child("64x64", problem)
  assert out is None and "KOSMOS_SM90_TILE=64x64 is not a tile shape" in bad.stderr, bad.stderr[-3000:]
  assert "128x192" in bad.stderr and "single" in bad.stderr, bad.stderr[-3000:]
  bad, out = _in_child("128x256c2", problem)
  assert out is None and "KOSMOS_SM90_TILE=128x256c2 is not a tile shape" in bad.stderr, bad.stderr[-3000:]


def test_split_plan_head_and_tail():
  """By default plan_gemm splits 70B-QKV-like problems (320 tiles of 128x256
  would run 2.4 waves): a head launch of 128x256 tiles over whole waves, then a
  tail launch of 128x128 over the rest. TN splits a K-major A, NT an MN-major
  one (the tail keeps the whole A's leading dimension). KOSMOS_SM90_TILE=single
  runs the same problems as one launch each."""
  if getattr(_gpu(), "compute_capability", "") != "9.0" or getattr(_gpu(), "core_count", 132) != 132:
    pytest.skip("the split plan asserted here is the one for 132 SMs")
  # K = 4096: at K = 1024 the second launch's cost eats the predicted gain (kSplitMinGain).
  problems = [("TN", (8192, 4096), (4096, 1280)), ("NT", (4096, 1280), (4096, 8192))]
  r, out = _in_child("", problems)
  assert out is not None, r.stderr[-3000:]
  assert out["runs"] == {"sm90_128x256": 2, "sm90_128x128": 2}, out
  assert all(e < 1e-2 for e in out["errs"]), out
  r, out = _in_child("single", problems)
  assert out is not None, r.stderr[-3000:]
  assert out["runs"] == {"sm90_128x128": 2}, out
  assert all(e < 1e-2 for e in out["errs"]), out

