"""Role timelines recorded by the fused kernels (kosmos_jax.trace.capture). Runs only
with an extension built with KOSMOS_TRACE=ON (`TRACE=1 bash scripts/gpu_test.sh`);
skipped otherwise."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kosmos_jax import _ext, ops, trace
from helpers import P, fresh, gpu_mesh, put, shard_map


@pytest.fixture(autouse=True)
def _traced_build():
  mod, _ = _ext._module()
  if mod is None or not hasattr(mod, "trace_compiled") or not mod.trace_compiled():
    pytest.skip("extension built without KOSMOS_TRACE")


def _roles(recs):
  return {trace.ROLE_NAMES[r] for r in np.unique(recs["role"]).tolist()}


@pytest.mark.parametrize("kernel", ["ag_tn", "tn_rs"])
def test_capture_records_every_cta_and_role(kernel):
  mesh = gpu_mesh(2)
  if kernel == "ag_tn":
    x, w = fresh((1024, 256), jnp.bfloat16), fresh((256, 512), jnp.bfloat16, scale=0.06)
    xs, ws, ys, op, want = P("tp", None), P(), P("tp", None), ops.ag_tn, {"move", "build"}
  else:
    x, w = fresh((1024, 512), jnp.bfloat16), fresh((512, 512), jnp.bfloat16, scale=0.04)
    xs, ws, ys, op, want = P(None, "tp"), P("tp", None), P("tp", None), ops.tn_rs, {"reduce", "build"}
  f = shard_map(lambda a, b: op(a, b, axis_name="tp", impl="fused", cu_cap=8), mesh, in_specs=(xs, ws),
                out_specs=ys)
  args = (put(x, mesh, xs), put(w, mesh, ws))
  jax.block_until_ready(f(*args))
  _, recs, dropped = trace.capture(f, *args)
  assert dropped == 0 and recs.size > 0
  assert want <= _roles(recs), (kernel, _roles(recs))
  assert set(np.unique(recs["rank"]).tolist()) == {0, 1}
  for rank in (0, 1):
    ctas = set(np.unique(recs["cta"][recs["rank"] == rank]).tolist())
    # AG: every CTA builds (one span each); RS: a reducer that claimed no slice has no span.
    assert ctas == set(range(8)) if kernel == "ag_tn" else ctas <= set(range(8)), (rank, ctas)
  assert np.all(recs["end_ns"] >= recs["start_ns"])
  trace.to_chrome_trace(recs)  # well-formed


@pytest.mark.parametrize("transport", ["pull", "push"])
@pytest.mark.parametrize("kernel", ["ag_tn", "tn_rs"])
def test_loopback_capture_keeps_ranks_apart(kernel, transport):
  # Every rank on GPU 0: each rank's CTAs record into their own lists
  # (GroupInfo.trace_list), so both ranks' CTAs 0..cap-1 appear, once each per span.
  from kosmos_jax.testing import loopback
  rng = np.random.default_rng(0)
  rows, k, n, cap = 512, 256, 512, 8
  x_rows = rows if kernel == "ag_tn" else 2 * rows
  inputs = [[[rng.standard_normal((x_rows, k), np.float32).astype(jnp.bfloat16),
              (0.06 * rng.standard_normal((k, n), np.float32)).astype(jnp.bfloat16)] for _ in range(2)]]
  recs, dropped = loopback.capture([kernel], 2, rows, k, n, inputs, cu_cap=cap, transports=(transport,))
  want = {"move", "build"} if kernel == "ag_tn" else {"reduce", "build"}
  assert dropped == 0 and want <= _roles(recs), (kernel, _roles(recs))
  for rank in (0, 1):
    ctas = set(np.unique(recs["cta"][recs["rank"] == rank]).tolist())
    assert ctas == set(range(cap)) if kernel == "ag_tn" else ctas <= set(range(cap)), (rank, ctas)
  assert np.all(recs["end_ns"] >= recs["start_ns"])
