"""Input validation shared by the per-device ops: raised in Python, before lowering,
with messages that name the offending values."""
from __future__ import annotations

import jax.numpy as jnp

from kosmos_jax import _compat

SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def axis_size(op: str, axis_name) -> int:
  """Size of the mesh axis `axis_name`; ValueError if it is not bound (outside shard_map)."""
  if not isinstance(axis_name, (str, tuple)) or (isinstance(axis_name, tuple) and not axis_name):
    raise ValueError(f"{op}: axis_name={axis_name!r} must be a mesh axis name (str) or a tuple of them")
  try:
    return int(_compat.axis_size(axis_name))
  except NameError as e:
    raise ValueError(
        f"{op}: axis_name={axis_name!r} is not bound here ({e}). kosmos ops are per-device: "
        "call them inside jax.shard_map over a mesh that has this axis, or use the "
        "kosmos_jax.nn modules, which do that for you.") from None


def dtypes(op: str, **arrays) -> jnp.dtype:
  """All arrays share one supported floating dtype; returns it (TypeError otherwise)."""
  seen = {name: jnp.dtype(a.dtype) for name, a in arrays.items()}
  for name, dt in seen.items():
    if dt not in SUPPORTED_DTYPES:
      raise TypeError(f"{op}: {name}.dtype={dt} is not supported; use one of "
                      f"{[str(d) for d in SUPPORTED_DTYPES]}")
  if len(set(seen.values())) > 1:
    desc = ", ".join(f"{n}.dtype={d}" for n, d in seen.items())
    raise TypeError(f"{op}: operands must share one dtype, got {desc}")
  return next(iter(seen.values()))


def ndim_at_least(op: str, name: str, a, n: int) -> None:
  if a.ndim < n:
    raise ValueError(f"{op}: {name} must have at least {n} dims, got {name}.shape={tuple(a.shape)}")


def rank2(op: str, name: str, a) -> None:
  if a.ndim != 2:
    raise ValueError(f"{op}: {name} must be 2-D, got {name}.shape={tuple(a.shape)}")


def equal(op: str, what: str, **values) -> None:
  """All named integer values are equal (e.g. contraction sizes)."""
  if len(set(values.values())) > 1:
    desc = ", ".join(f"{n}={v}" for n, v in values.items())
    raise ValueError(f"{op}: {what} must match, got {desc}")


def same_leading(op: str, **arrays) -> None:
  """Leading (batch) dims, everything before the last two, agree."""
  lead = {n: tuple(a.shape[:-2]) for n, a in arrays.items()}
  if len(set(lead.values())) > 1:
    desc = ", ".join(f"{n}.shape[:-2]={v}" for n, v in lead.items())
    raise ValueError(f"{op}: leading (batch) dims must match, got {desc}")


def divisible(op: str, name: str, value: int, by_name: str, by: int) -> None:
  if value % by:
    raise ValueError(f"{op}: {name}={value} must be a multiple of {by_name}={by}")


def nonempty(op: str, **arrays) -> None:
  """No zero-size dimension (XLA would accept the trace and fail in lowering)."""
  for name, a in arrays.items():
    if 0 in a.shape:
      raise ValueError(f"{op}: {name}.shape={tuple(a.shape)} has a zero-size dimension; every "
                       "dimension must be >= 1")


def varies(op: str, name: str, a, axis_name, size: int, spec: str, wrong: str) -> None:
  """`a` is split over `axis_name` (each rank holds its own part), not replicated.
  `spec`: the expected in_specs, with {axis} for the axis name; `wrong`: what a
  replicated operand would do.

  A replicated operand type-checks and runs, but gathering it repeats it tp times and
  reduce-scattering it sums it tp times. Only checkable where shard_map tracks
  varying axes (check_vma=True, the default); at size 1 replication is harmless.
  """
  if size == 1 or not _compat.vma_checked():
    return
  axes = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
  seen = _compat.vma(a)
  if not all(ax in seen for ax in axes):
    raise ValueError(
        f"{op}: {name} does not vary over axis_name={axis_name!r} (it varies over "
        f"{sorted(seen) or 'no axis'}): {name} must be each rank's own part, e.g. shard_map "
        f"in_specs {spec.format(axis=repr(axis_name))}; a replicated {name} would {wrong}")
