"""Fused AG+GEMM (kosmos_ag_tn) on the GPUs of one process (peer-access heaps),
against its reference twin and a float64 dense oracle. Outputs are poisoned with
NaN before every launch (tests/gpu/conftest.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kosmos_jax import AgConfig, ops, reference
from helpers import P, assert_close, fresh, gpu_mesh, put, shard_map


def _oracle(x, w):
  return np.asarray(x, np.float64) @ np.asarray(w, np.float64)


# Every device returns the whole gathered product; out_specs stacks the copies along
# the batch axis, so [tp*batch, m, n] holds each device's result in turn.
OUT = P("tp", None, None)


def _copies(y, tp):
  return np.split(np.asarray(jnp.asarray(y, jnp.float32)), tp, axis=0)


def _run(mesh, fn, x, w):
  f = shard_map(fn, mesh, in_specs=(P(None, "tp", None), P()), out_specs=OUT)
  return f(put(x, mesh, P(None, "tp", None)), put(w, mesh, P()))


def _fused(**kw):
  return lambda x, w: ops.ag_tn(x, w, axis_name="tp", impl="fused", config=AgConfig(**kw))


def _check(mesh, x, w, dtype, **kw):
  tp = mesh.shape["tp"]
  y = _run(mesh, _fused(**kw), x, w)
  with jax.default_matmul_precision("highest"):  # XLA's GPU default for f32 is TF32
    ref = _run(mesh, lambda a, b: reference.ag_tn(a, b, axis_name="tp"), x, w)
  oracle = _oracle(jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32))
  assert y.shape == ref.shape == (tp * x.shape[0], x.shape[1], w.shape[1]), (y.shape, ref.shape, tp)
  for rank, (got, twin) in enumerate(zip(_copies(y, tp), _copies(ref, tp))):  # every device's copy
    assert_close(got, twin, dtype, what=f"fused vs twin, rank {rank} {kw}")
    assert_close(got, oracle, dtype, what=f"fused vs oracle, rank {rank} {kw}")


SHAPES = [  # (batch, m total, k, n, dtype)
    (1, 512, 256, 384, jnp.float32),
    (2, 400, 320, 300, jnp.bfloat16),  # rows not a tile multiple; batch boundaries inside tiles
    (1, 1024, 136, 130, jnp.float16),
    (3, 6, 24, 8, jnp.float32),        # tiny: one partial tile
]


@pytest.mark.parametrize("b,m,k,n,dtype", SHAPES)
def test_ag_tn_fused_matches_twin_and_oracle(b, m, k, n, dtype):
  mesh = gpu_mesh(2)
  _check(mesh, fresh((b, m, k), dtype), fresh((k, n), dtype, scale=k ** -0.5), dtype)


@pytest.mark.parametrize("kw", [dict(cu_cap=1), dict(cu_cap=1, movers=1), dict(cu_cap=7),
                                dict(movers=0), dict(cu_cap=3, movers=3)],
                         ids=["grid1", "grid1-mover", "cap7", "no-movers", "all-movers"])
def test_ag_tn_fused_grids(kw):
  mesh = gpu_mesh(2)
  _check(mesh, fresh((2, 768, 192), jnp.bfloat16), fresh((192, 256), jnp.bfloat16, scale=0.07),
         jnp.bfloat16, **kw)


def test_ag_tn_fused_back_to_back_fresh_inputs():
  """Many calls with new inputs reuse the heap: epochs and the done-handshake must
  keep every call's rows apart (a stale row shows up as a mismatch)."""
  mesh = gpu_mesh(2)
  f = shard_map(_fused(), mesh, in_specs=(P(None, "tp", None), P()), out_specs=OUT)
  ins = [(fresh((1, 1024, 256), jnp.float32), fresh((256, 512), jnp.float32, scale=1 / 16)) for _ in range(12)]
  outs = [f(put(x, mesh, P(None, "tp", None)), put(w, mesh, P())) for x, w in ins]  # pipelined, one sync
  for i, ((x, w), y) in enumerate(zip(ins, outs)):
    for rank, got in enumerate(_copies(y, 2)):
      assert_close(got, _oracle(x, w), jnp.float32, what=f"back-to-back call {i}, rank {rank}")


def test_ag_tn_fused_in_one_program_twice():
  """Two fused calls in one jitted program (epochs advance inside one executable)."""
  mesh = gpu_mesh(2)
  x, w1, w2 = fresh((1, 512, 128), jnp.float32), fresh((128, 128), jnp.float32, 0.1), fresh((128, 64), jnp.float32, 0.1)

  def two(a, b, c):
    y = ops.ag_tn(a, b, axis_name="tp", impl="fused")
    rows = y.shape[-2] // 2
    mine = jax.lax.dynamic_slice_in_dim(y, jax.lax.axis_index("tp") * rows, rows, axis=1)
    return ops.ag_tn(mine, c, axis_name="tp", impl="fused")

  f = shard_map(two, mesh, in_specs=(P(None, "tp", None), P(), P()), out_specs=OUT)
  y = f(put(x, mesh, P(None, "tp", None)), put(w1, mesh, P()), put(w2, mesh, P()))
  for rank, got in enumerate(_copies(y, 2)):
    assert_close(got, _oracle(_oracle(x, w1), w2), jnp.float32, what=f"two calls, rank {rank}")


def test_ag_tn_dispatch_fused_env(monkeypatch):
  """KOSMOS_IMPL=fused routes ops.ag_tn to the kernel (and never to the twin)."""
  mesh = gpu_mesh(2)
  monkeypatch.setenv("KOSMOS_IMPL", "fused")
  x, w = fresh((1, 256, 64), jnp.bfloat16), fresh((64, 96), jnp.bfloat16, 0.125)
  f = shard_map(lambda a, b: ops.ag_tn(a, b, axis_name="tp", cu_cap=16), mesh,
                in_specs=(P(None, "tp", None), P()), out_specs=OUT)
  text = f.lower(put(x, mesh, P(None, "tp", None)), put(w, mesh, P())).as_text()
  assert "kosmos_ag_tn" in text and "all-gather" not in text and "all_gather" not in text
  y = f(put(x, mesh, P(None, "tp", None)), put(w, mesh, P()))
  for rank, got in enumerate(_copies(y, 2)):
    assert_close(got, _oracle(x, w), jnp.bfloat16, what=f"KOSMOS_IMPL=fused, rank {rank}")


def test_ag_tn_fused_single_device_group():
  mesh = gpu_mesh(1)
  x, w = fresh((2, 200, 64), jnp.float32), fresh((64, 72), jnp.float32, 0.125)
  _check(mesh, x, w, jnp.float32)
