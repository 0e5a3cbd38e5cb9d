"""Fused GEMM + reduce-scatter (kosmos_tn_rs) on the GPUs of one process
(peer-access heaps), against its reference twin and a float64 dense oracle.
The row-parallel layout: x [..., m, K] and w [K, n] are split along K, each
device computes its partial x_d @ w_d, and device r keeps rows r*m/tp.. of the
sum. Outputs are poisoned with NaN before every launch (tests/gpu/conftest.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kosmos_jax import RsConfig, ops, reference
from helpers import P, assert_close, fresh, gpu_mesh, put, shard_map


def _specs(ndim):
  lead = (None,) * (ndim - 2)
  return P(*lead, None, "tp"), P("tp", None), P(*lead, "tp", None)  # x, w, y


def _run(mesh, fn, x, w):
  xs, ws, ys = _specs(x.ndim)
  f = shard_map(fn, mesh, in_specs=(xs, ws), out_specs=ys)
  return f(put(x, mesh, xs), put(w, mesh, ws))


def _fused(**kw):
  return lambda x, w: ops.tn_rs(x, w, axis_name="tp", impl="fused", config=RsConfig(**kw))


def _oracle(x, w):
  return np.asarray(jnp.asarray(x, jnp.float32), np.float64) @ np.asarray(jnp.asarray(w, jnp.float32), np.float64)


def _check(mesh, x, w, dtype, **kw):
  y = _run(mesh, _fused(**kw), x, w)
  with jax.default_matmul_precision("highest"):  # XLA's GPU default for f32 is TF32
    ref = _run(mesh, lambda a, b: reference.tn_rs(a, b, axis_name="tp"), x, w)
  assert y.shape == ref.shape == (*x.shape[:-1], w.shape[1]), (y.shape, ref.shape)
  assert y.dtype == x.dtype, y.dtype
  assert_close(y, ref, dtype, what=f"fused vs twin {kw}")
  assert_close(y, _oracle(x, w), dtype, what=f"fused vs oracle {kw}")
  return y


SHAPES = [  # (lead dims, m, K total, n, dtype)
    ((), 512, 256, 384, jnp.float32),
    ((2,), 400, 320, 300, jnp.bfloat16),  # 200 rows per rank: not a tile multiple; batch fold
    ((1,), 1024, 136, 130, jnp.float16),
    ((3,), 6, 24, 8, jnp.float32),        # tiny: one partial tile per chunk
    ((2, 2), 260, 64, 129, jnp.bfloat16),  # two lead dims; 130 rows, 129 columns
]


@pytest.mark.parametrize("lead,m,k,n,dtype", SHAPES)
def test_tn_rs_fused_matches_twin_and_oracle(lead, m, k, n, dtype):
  mesh = gpu_mesh(2)
  _check(mesh, fresh((*lead, m, k), dtype), fresh((k, n), dtype, scale=k ** -0.5), dtype)


GRIDS = [dict(cu_cap=1), dict(cu_cap=1, reducers=1), dict(cu_cap=7), dict(reducers=0), dict(cu_cap=3, reducers=3)]
GRID_IDS = ["grid1", "grid1-reducer", "cap7", "no-reducers", "all-reducers"]


@pytest.mark.parametrize("kw", GRIDS, ids=GRID_IDS)
def test_tn_rs_fused_grids(kw):
  mesh = gpu_mesh(2)
  _check(mesh, fresh((2, 768, 192), jnp.bfloat16), fresh((192, 256), jnp.bfloat16, scale=0.07),
         jnp.bfloat16, **kw)


def test_tn_rs_fused_bitwise_whatever_the_grid():
  """Fixed-order fp32 sums rounded once: the bits depend on the data alone, not on
  which CTA built or reduced what, nor on the run."""
  mesh = gpu_mesh(2)
  x, w = fresh((1, 1000, 384), jnp.bfloat16), fresh((384, 520), jnp.bfloat16, scale=0.05)
  runs = [np.asarray(_run(mesh, _fused(**kw), x, w)).view(np.uint16)
          for kw in (dict(), dict(), dict(cu_cap=1), dict(cu_cap=7, reducers=3))]
  for i, r in enumerate(runs[1:], 1):
    assert np.array_equal(runs[0], r), f"run {i} differs in {np.count_nonzero(runs[0] != r)} elements"


def test_tn_rs_fused_back_to_back_fresh_inputs():
  """Calls with new inputs reuse the staging: epochs and the done-handshake must
  keep every call's partials apart (a stale partial shows up as a mismatch)."""
  mesh = gpu_mesh(2)
  xs, ws, ys = _specs(3)
  f = shard_map(_fused(), mesh, in_specs=(xs, ws), out_specs=ys)
  ins = [(fresh((1, 1024, 256), jnp.float32), fresh((256, 512), jnp.float32, scale=1 / 16)) for _ in range(12)]
  outs = [f(put(x, mesh, xs), put(w, mesh, ws)) for x, w in ins]  # pipelined, one sync
  for i, ((x, w), y) in enumerate(zip(ins, outs)):
    assert_close(y, _oracle(x, w), jnp.float32, what=f"back-to-back call {i}")


def test_tn_rs_after_ag_tn_shares_the_data_region():
  """ag_tn and tn_rs alternate over one heap data region (HeapUse hands it over)."""
  mesh = gpu_mesh(2)

  def both(x, w1, w2):  # x [1, m/tp, k] -> AG -> [1, m, h] -> RS -> [1, m/tp, k]
    return ops.tn_rs(ops.ag_tn(x, w1, axis_name="tp", impl="fused"), w2, axis_name="tp", impl="fused")

  f = shard_map(both, mesh, in_specs=(P(None, "tp", None), P(None, "tp"), P("tp", None)),
                out_specs=P(None, "tp", None))
  for i in range(4):
    x, w1, w2 = fresh((1, 512, 128), jnp.float32), fresh((128, 256), jnp.float32, 0.09), fresh((256, 96), jnp.float32, 0.06)
    y = f(put(x, mesh, P(None, "tp", None)), put(w1, mesh, P(None, "tp")), put(w2, mesh, P("tp", None)))
    assert_close(y, _oracle(_oracle(x, w1), w2), jnp.float32, what=f"ag_tn -> tn_rs, round {i}")


def test_tn_rs_dispatch_fused_env(monkeypatch):
  """KOSMOS_IMPL=fused routes ops.tn_rs to the kernel (and never to the twin)."""
  mesh = gpu_mesh(2)
  monkeypatch.setenv("KOSMOS_IMPL", "fused")
  x, w = fresh((1, 256, 64), jnp.bfloat16), fresh((64, 96), jnp.bfloat16, 0.125)
  xs, ws, ys = _specs(3)
  f = shard_map(lambda a, b: ops.tn_rs(a, b, axis_name="tp", cu_cap=16), mesh, in_specs=(xs, ws), out_specs=ys)
  text = f.lower(put(x, mesh, xs), put(w, mesh, ws)).as_text()
  assert "kosmos_tn_rs" in text and "reduce_scatter" not in text and "reduce-scatter" not in text
  assert_close(f(put(x, mesh, xs), put(w, mesh, ws)), _oracle(x, w), jnp.bfloat16, what="KOSMOS_IMPL=fused")


def test_tn_rs_fused_single_device_group():
  mesh = gpu_mesh(1)
  _check(mesh, fresh((2, 200, 64), jnp.float32), fresh((64, 72), jnp.float32, 0.125), jnp.float32)


def test_tn_rs_heap_too_small_names_the_fix():
  mesh = gpu_mesh(2)
  from kosmos_jax import runtime
  heap = runtime.init()["heap_mb"] << 20
  m, nt = 4096, heap // (2 * 16 * 128 * 128 * 4) + 1  # 16 tile rows per chunk: staging > heap
  x, w = fresh((m, 16), jnp.float32), fresh((16, nt * 128), jnp.float32)
  with pytest.raises(Exception, match=r"MiB of heap.*KOSMOS_HEAP_MB.*heap_mb="):
    jax.block_until_ready(_run(mesh, _fused(), x, w))


@pytest.mark.slow
@pytest.mark.parametrize("cu_cap", [None, 1, 7], ids=["full", "grid1", "cap7"])
def test_tn_rs_200_dispatches_fresh_inputs(cu_cap):
  """200 calls back to back, one sync at the end: epochs, step_claimed/pub flags
  and the done-handshake must neither hang (bounded waits trap) nor mix calls."""
  mesh = gpu_mesh(2)
  xs, ws, ys = _specs(3)
  f = shard_map(_fused(cu_cap=cu_cap), mesh, in_specs=(xs, ws), out_specs=ys)
  ins = [(fresh((1, 256, 128), jnp.float32), fresh((128, 96), jnp.float32, scale=0.09)) for _ in range(200)]
  outs = [f(put(x, mesh, xs), put(w, mesh, ws)) for x, w in ins]
  for i, ((x, w), y) in enumerate(zip(ins, outs)):
    assert_close(y, _oracle(x, w), jnp.float32, what=f"call {i} cu_cap={cu_cap}")
