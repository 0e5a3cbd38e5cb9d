"""Every JAX-version shim, in one place (jax>=0.10.2 on CPU CI, 0.11.x on the GPU host)."""
from __future__ import annotations

import jax

shard_map = jax.shard_map


def axis_size(axis_name) -> int:
  """Size of a bound mesh axis (or product over a tuple of axes); NameError if unbound."""
  return jax.lax.axis_size(axis_name)


def vma(x) -> frozenset:
  """Mesh axes over which `x` varies inside shard_map (empty outside or when unchecked)."""
  aval = jax.typeof(x)
  mat = getattr(aval, "manual_axis_type", None)  # jax 0.10: ManualAxisType.varying
  if mat is not None:
    return frozenset(mat.varying)
  return frozenset(getattr(aval, "vma", None) or ())  # older spelling


def vma_checked() -> bool:
  """Whether the enclosing shard_map types values by the axes they vary over
  (check_vma=True, its default). With check_vma=False `vma` is always empty, so
  "does not vary" cannot be told from "not tracked"."""
  try:
    from jax._src import config as _config
    return bool(_config._check_vma.value)
  except (ImportError, AttributeError):  # moved in a later JAX: treat as untracked
    return False


def reduce_to_vma(ct, target: frozenset):
  """Sum a cotangent over the mesh axes it varies in but its primal did not.

  A parameter replicated over `dp` but used with `dp`-sharded activations gets a
  per-device partial gradient; shard_map's typing (check_vma) requires the
  custom_vjp rule to return the summed, invariant value.
  """
  extra = tuple(sorted(vma(ct) - frozenset(target)))
  return jax.lax.psum(ct, extra) if extra else ct


def pvary_to(x, target: frozenset):
  """Mark `x` as varying over `target` axes it does not yet vary in (no data movement)."""
  missing = tuple(sorted(frozenset(target) - vma(x)))
  if not missing:
    return x
  pvary = getattr(jax.lax, "pcast", None)
  if pvary is not None:
    return pvary(x, missing, to="varying")
  return jax.lax.pvary(x, missing)


def _is_explicit(mesh) -> bool:
  types = getattr(mesh, "axis_types", None) or ()
  return any("Explicit" in str(t) for t in types)


def constrain(x, mesh, spec):
  """Give a global array the sharding `spec` on `mesh` before a shard_map.

  Explicit-axis meshes (jax.make_mesh's default since 0.7) require shard_map inputs
  to carry their in_specs already, so reshard; Auto meshes take a constraint.
  """
  sharding = jax.sharding.NamedSharding(mesh, spec)
  if _is_explicit(mesh):
    return jax.sharding.reshard(x, sharding)
  return jax.lax.with_sharding_constraint(x, sharding)
