"""What every kosmos Flax module shares: constructor and mesh-axis checks, the
sequence-parallel activation specs, and the shard_map wrapper around a functional layer."""
from __future__ import annotations

from typing import Callable, Sequence

import jax
from jax.sharding import PartitionSpec as P

from kosmos_jax import _compat
from kosmos_jax.ops._dispatch import check_impl


def check_module(name: str, *, impl, use_bias: bool | None = None, **sizes) -> None:
  """Constructor arguments, checked where they are given rather than on first call:
  `impl` is a known path name, every size a positive int, and `use_bias` (for modules
  whose fused kernels have no bias epilogue) is False."""
  if impl is not None:
    check_impl(impl, source=f"{name}: impl")
  for what, v in sizes.items():
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
      raise ValueError(f"{name}: {what}={v!r} must be a positive int")
  if use_bias:
    raise ValueError(f"{name}: use_bias={use_bias!r} is not supported: its fused kernels have no "
                     "bias epilogue (Llama-style SwiGLU blocks have none); use use_bias=False")


def check_axes(mesh, **axes) -> None:
  """Each given axis name (None allowed) exists in `mesh`."""
  for role, name in axes.items():
    if name is not None and name not in mesh.axis_names:
      raise ValueError(f"{role}={name!r} is not an axis of the mesh (axes: {tuple(mesh.axis_names)})")


def act_spec(ndim: int, dp_axis, seq_axis, feat_axis) -> P:
  """[batch.., seq, features] activation spec: batch over dp, seq and features as given."""
  if ndim < 2:
    raise ValueError(f"activations must be [..., seq, features], got ndim={ndim}")
  lead = [None] * (ndim - 2)
  if lead:
    lead[0] = dp_axis
  return P(*lead, seq_axis, feat_axis)


def check_act(name: str, x, *, mesh, features: int, dp_axis, seq_axis) -> None:
  """Global activation shape fits the module and divides over the mesh."""
  if x.ndim < 2:
    raise ValueError(f"{name}: x must be [batch.., seq, features], got x.shape={tuple(x.shape)}")
  if 0 in x.shape:
    raise ValueError(f"{name}: x.shape={tuple(x.shape)} has a zero-size dimension; every "
                     "dimension must be >= 1")
  if x.shape[-1] != features:
    raise ValueError(f"{name}: x.shape[-1]={x.shape[-1]} must equal in_features={features}")
  sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
  if seq_axis is not None and x.shape[-2] % sizes[seq_axis]:
    raise ValueError(f"{name}: seq={x.shape[-2]} must be a multiple of the '{seq_axis}' axis size "
                     f"{sizes[seq_axis]}")
  if dp_axis is not None and x.ndim >= 3 and x.shape[0] % sizes[dp_axis]:
    raise ValueError(f"{name}: batch={x.shape[0]} must be a multiple of the '{dp_axis}' axis size "
                     f"{sizes[dp_axis]}")


def run_sharded(fn: Callable, mesh, args: Sequence, in_specs: Sequence[P], out_specs):
  """Constrain global `args` to `in_specs`, then run per-device `fn` under shard_map."""
  args = [_compat.constrain(a, mesh, s) for a, s in zip(args, in_specs)]
  return _compat.shard_map(fn, mesh=mesh, in_specs=tuple(in_specs), out_specs=out_specs)(*args)
