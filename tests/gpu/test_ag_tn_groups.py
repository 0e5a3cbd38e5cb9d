"""Fused AG+GEMM over several groups from one device: each group has its own
control block (epochs, queues, done flags), so devices that call different
groups a different number of times never drift apart (a drift hangs or reads
stale rows). Calls are dispatched back to back, then all checked."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kosmos_jax import ops
from helpers import P, assert_close, fresh, put, shard_map

SPEC = P(None, ("dp", "tp"), None)  # local rows of device (d, t): block d*tp + t
OUT = P(("dp", "tp"), None, None)  # every device's gathered product, stacked on batch


def _gpus(n):
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  if len(gpus) < n:
    pytest.skip(f"needs {n} GPUs, found {len(gpus)}")
  return gpus


def _caller(devs, dp, tp):
  """(mesh, jitted f) all-gathering over 'tp' groups of a (dp, tp) mesh."""
  mesh = jax.sharding.Mesh(np.array(devs).reshape(dp, tp), ("dp", "tp"))
  f = shard_map(lambda a, b: ops.ag_tn(a, b, axis_name="tp", impl="fused"), mesh, in_specs=(SPEC, P()), out_specs=OUT)
  return mesh, f


def _expect(x, w, dp, tp):
  """Per-device oracle copies, in the order OUT stacks them."""
  full = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  chunks = np.split(full, dp, axis=1)  # group d gathers row blocks d*tp .. d*tp+tp-1
  return [chunks[d] for d in range(dp) for _ in range(tp)]


def test_interleaved_groups_unequal_counts():
  g = _gpus(2)
  callers = {
      "pair": (_caller(g[:2], 1, 2), 1, 2),
      "pair_rev": (_caller(g[1::-1], 1, 2), 1, 2),  # group (1, 0): its own slot, ranks swapped
      "solo0": (_caller(g[:1], 1, 1), 1, 1),        # only device 0 advances this one
      "solo1": (_caller(g[1:2], 1, 1), 1, 1),
      "singles": (_caller(g[:2], 2, 1), 2, 1),      # two size-1 groups in one call
  }
  pattern = ("pair solo0 solo0 solo0 pair singles solo1 pair_rev pair solo0 singles singles "
             "solo1 solo1 pair pair_rev pair_rev solo0 pair solo1 pair").split()
  runs = []
  for i, name in enumerate(pattern):
    ((mesh, f), dp, tp) = callers[name]
    x, w = fresh((1, 256 * dp * tp, 96), jnp.float32), fresh((96, 80), jnp.float32, scale=0.1)
    runs.append((i, name, dp, tp, x, w, f(put(x, mesh, SPEC), put(w, mesh, P()))))  # no sync between calls
  for i, name, dp, tp, x, w, y in runs:
    got = np.split(np.asarray(y, np.float64), dp * tp, axis=0)
    for dev, (a, b) in enumerate(zip(got, _expect(x, w, dp, tp))):
      assert_close(a, b, jnp.float32, what=f"call {i} ({name}), device {dev}")
