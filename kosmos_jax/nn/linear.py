"""Flax NNX TP+SP linears over `kosmos_jax.tp` (no math here: casting, params, sharding).

Both take global `[batch, seq, features]` arrays under `jax.jit`:
  ColumnParallelLinear  in  P(dp, tp, None)  (sequence-sharded)
                        out P(dp, None, tp)  (full sequence, feature-sharded)
  RowParallelLinear     in  P(dp, None, tp)
                        out P(dp, tp, None)
so a Column -> elementwise -> Row pair needs no resharding between them.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes
from jax.sharding import PartitionSpec as P

from kosmos_jax import tp as tp_lib
from kosmos_jax.nn import _spmd

default_kernel_init = nnx.initializers.lecun_normal()
Dtype = Any


class _ParallelLinear(nnx.Module):
  """Shared construction; subclasses fix which weight dimension is sharded over tp.

  Arguments follow flax.nnx.Linear (dtype, param_dtype, use_bias, kernel_init,
  bias_init, promote_dtype), except that use_bias defaults to False (Llama-style
  blocks carry no biases); `impl` picks the op path, and `cu_cap`, `ag_config`
  (kosmos_jax.AgConfig) and `rs_config` (kosmos_jax.RsConfig) are the fused
  kernels' knobs, passed to `kosmos_jax.tp` as they are (see there which op takes
  which). All four are checked here. Both linears take both configs, so one set of
  knobs can be passed to every layer of a model. `precision` (flax.nnx.Linear's)
  reaches every dot of both directions on the reference path; the fused kernels
  take only None (a ValueError at the call otherwise).
  """

  _bias_sharded: bool  # subclasses: is the output dim (and so the bias) sharded over tp?

  def __init__(self, in_features: int, out_features: int, *, mesh: jax.sharding.Mesh,
               tp_axis: str = "tp", dp_axis: str | None = None, use_bias: bool = False,
               dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
               kernel_init=default_kernel_init, bias_init=nnx.initializers.zeros_init(),
               promote_dtype=dtypes.promote_dtype, impl: str | None = None, cu_cap: int | None = None,
               ag_config=None, rs_config=None, precision=None, rngs: nnx.Rngs):
    _spmd.check_module(type(self).__name__, impl=impl, in_features=in_features,
                       out_features=out_features)
    tp_lib._check_knobs(type(self).__name__, cu_cap, ag_config, rs_config)
    _spmd.check_axes(mesh, tp_axis=tp_axis, dp_axis=dp_axis)
    tp = mesh.shape[tp_axis]
    sharded = out_features if self._bias_sharded else in_features
    if sharded % tp:
      which = "out_features" if self._bias_sharded else "in_features"
      raise ValueError(f"{type(self).__name__}: {which}={sharded} must be a multiple of the "
                       f"'{tp_axis}' axis size {tp}")
    self.in_features, self.out_features = in_features, out_features
    self.mesh, self.tp_axis, self.dp_axis = mesh, tp_axis, dp_axis
    self.dtype, self.param_dtype, self.impl = dtype, param_dtype, impl
    self.cu_cap, self.ag_config, self.rs_config = cu_cap, ag_config, rs_config
    self.precision = precision
    self.promote_dtype = promote_dtype
    axes = self._axes(tp_axis)
    self.kernel = nnx.Param(nnx.with_partitioning(kernel_init, axes, mesh=mesh)(
        rngs.params(), (in_features, out_features), param_dtype))
    b_axes = (tp_axis,) if self._bias_sharded else (None,)
    self.bias = nnx.Param(nnx.with_partitioning(bias_init, b_axes, mesh=mesh)(
        rngs.params(), (out_features,), param_dtype)) if use_bias else None

  def _apply(self, x, linear, x_axes, y_axes, kernel_spec, bias_spec):
    """Cast, then run `linear` per device under shard_map. x_axes / y_axes: the
    (seq, features) mesh axes of the global input / output activations."""
    _spmd.check_act(type(self).__name__, x, mesh=self.mesh, features=self.in_features,
                    dp_axis=self.dp_axis, seq_axis=self.tp_axis)
    tp, dp = self.tp_axis, self.dp_axis
    bias = self.bias[...] if self.bias is not None else None
    x, kernel, bias = self.promote_dtype((x, self.kernel[...], bias), dtype=self.dtype)

    def local(x, w, *b):
      y = linear(x, w, axis_name=tp, impl=self.impl, cu_cap=self.cu_cap, ag_config=self.ag_config,
                 rs_config=self.rs_config, precision=self.precision)
      return y + b[0] if b else y

    args = [x, kernel]
    specs = [_spmd.act_spec(x.ndim, dp, *x_axes), kernel_spec]
    if bias is not None:
      args.append(bias)
      specs.append(bias_spec)
    return _spmd.run_sharded(local, self.mesh, args, specs, _spmd.act_spec(x.ndim, dp, *y_axes))


class ColumnParallelLinear(_ParallelLinear):
  """y = AG_seq(x) @ W (+ b): kernel [in, out] sharded over `tp_axis` on `out`."""

  _bias_sharded = True

  @staticmethod
  def _axes(tp_axis):
    return (None, tp_axis)

  def __call__(self, x):
    """x: [batch, seq, in] sequence-sharded -> [batch, seq, out] feature-sharded."""
    tp = self.tp_axis
    return self._apply(x, tp_lib.column_parallel_linear, (tp, None), (None, tp), P(None, tp), P(tp))


class RowParallelLinear(_ParallelLinear):
  """y = RS_seq(x @ W) (+ b): kernel [in, out] sharded over `tp_axis` on `in`."""

  _bias_sharded = False

  @staticmethod
  def _axes(tp_axis):
    return (tp_axis, None)

  def __call__(self, x):
    """x: [batch, seq, in] feature-sharded -> [batch, seq, out] sequence-sharded."""
    tp = self.tp_axis
    return self._apply(x, tp_lib.row_parallel_linear, (None, tp), (tp, None), P(tp, None), P(None))
