"""Shared test helpers: the tolerance table (DESIGN.md §6), the comparison, meshes
and fresh random inputs. Every test compares through `assert_close`."""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

# ||out - ref|| / ||ref|| allowed per operand precision.
TOLERANCE = {
    jnp.dtype(jnp.float32): 1e-5,
    jnp.dtype(jnp.bfloat16): 1e-2,
    jnp.dtype(jnp.float16): 1e-2,
}

_seed = itertools.count(1234)


def tol(dtype) -> float:
  return TOLERANCE[jnp.dtype(dtype)]


def rel_err(out, ref) -> float:
  out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
  ref = np.asarray(jnp.asarray(ref, jnp.float32), np.float64)
  assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
  denom = np.linalg.norm(ref)
  return float(np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0))


def assert_close(out, ref, dtype=None, *, what: str = "", rtol: float | None = None):
  """Relative Frobenius error within the table's tolerance; NaN never passes."""
  dtype = jnp.asarray(out).dtype if dtype is None else dtype
  bound = tol(dtype) if rtol is None else rtol
  o = np.asarray(jnp.asarray(out, jnp.float32))
  assert np.all(np.isfinite(o)), f"{what}: output has NaN/Inf"
  err = rel_err(out, ref)
  assert err <= bound, f"{what}: rel. error {err:.3e} > {bound:.1e} ({jnp.dtype(dtype)})"


def fresh(shape, dtype=jnp.float32, scale: float = 1.0):
  """Fresh normal random array (a new key every call: never zeros, never reused)."""
  key = jax.random.key(next(_seed))
  return (scale * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def mesh(tp: int, dp: int = 1, names=("dp", "tp")):
  """A (dp, tp) mesh over the first dp*tp virtual devices."""
  devs = np.array(jax.devices()[: dp * tp]).reshape(dp, tp)
  return jax.sharding.Mesh(devs, names)


def put(x, m, spec):
  return jax.device_put(x, NamedSharding(m, spec))


def shard_map(f, m, in_specs, out_specs):
  return jax.jit(jax.shard_map(f, mesh=m, in_specs=in_specs, out_specs=out_specs))


__all__ = ["TOLERANCE", "tol", "rel_err", "assert_close", "fresh", "mesh", "put", "shard_map", "P"]


def gpu_mesh(tp: int, *, hopper: bool = False):
  """A ('tp',) mesh over the first tp GPUs; skips the test when there are fewer, or
  (hopper=True) when they are not compute capability 9.0."""
  import pytest
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  if len(gpus) < tp:
    pytest.skip(f"needs {tp} GPUs, found {len(gpus)}")
  if hopper and gpus[0].compute_capability != "9.0":
    pytest.skip(f"Hopper builders need compute capability 9.0, found {gpus[0].compute_capability}")
  return jax.sharding.Mesh(np.array(gpus[:tp]), ("tp",))
