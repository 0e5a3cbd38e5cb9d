"""200 fused AG+GEMM calls back to back with fresh inputs, as 200 dispatches and as
one jitted loop, at full grid, one CTA and a CU cap: epochs and the done-handshake
must neither hang (bounded waits trap) nor mix rows of different calls."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kosmos_jax import AgConfig, ops
from helpers import P, assert_close, fresh, put, shard_map

CALLS = 200
GRIDS = [None, 1, 7]  # full grid, grid of 1 CTA, CU cap


def _mesh():
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  if len(gpus) < 2:
    pytest.skip(f"needs 2 GPUs, found {len(gpus)}")
  return jax.sharding.Mesh(np.array(gpus[:2]), ("tp",))


def _check(i, y, x, w, what):
  want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  for rank, got in enumerate(np.split(np.asarray(y, np.float64), 2, axis=0)):
    assert_close(got, want, jnp.float32, what=f"{what}, call {i}, rank {rank}")


@pytest.mark.slow
@pytest.mark.parametrize("cu_cap", GRIDS, ids=["full", "grid1", "cap7"])
def test_200_dispatches(cu_cap):
  mesh = _mesh()
  cfg = AgConfig(cu_cap=cu_cap)
  f = shard_map(lambda a, b: ops.ag_tn(a, b, axis_name="tp", impl="fused", config=cfg), mesh,
                in_specs=(P(None, "tp", None), P()), out_specs=P("tp", None, None))
  ins = [(fresh((1, 256, 128), jnp.float32), fresh((128, 96), jnp.float32, scale=0.09)) for _ in range(CALLS)]
  outs = [f(put(x, mesh, P(None, "tp", None)), put(w, mesh, P())) for x, w in ins]  # one sync at the end
  for i, ((x, w), y) in enumerate(zip(ins, outs)):
    _check(i, y, x, w, f"dispatch cu_cap={cu_cap}")


@pytest.mark.slow
@pytest.mark.parametrize("cu_cap", GRIDS, ids=["full", "grid1", "cap7"])
def test_200_calls_in_one_jitted_loop(cu_cap):
  mesh = _mesh()

  def loop(xs, w):  # xs: [CALLS, 1, m_local, k]; one kernel launch per step
    cfg = AgConfig(cu_cap=cu_cap)
    return jax.lax.scan(lambda c, x: (c, ops.ag_tn(x, w, axis_name="tp", impl="fused", config=cfg)), None, xs)[1]

  f = shard_map(loop, mesh, in_specs=(P(None, None, "tp", None), P()), out_specs=P(None, "tp", None, None))
  xs, w = fresh((CALLS, 1, 256, 128), jnp.float32), fresh((128, 96), jnp.float32, scale=0.09)
  ys = np.asarray(f(put(xs, mesh, P(None, None, "tp", None)), put(w, mesh, P())), np.float64)
  assert ys.shape == (CALLS, 2, 256, 96), ys.shape
  for i in range(0, CALLS):
    _check(i, ys[i], xs[i], w, f"jitted loop cu_cap={cu_cap}")
