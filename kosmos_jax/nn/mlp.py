"""Flax NNX SwiGLU MLP as one TP+SP column/row pair (`kosmos_jax.tp.parallel_swiglu_mlp`)."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes
from jax.sharding import PartitionSpec as P

from kosmos_jax import tp as tp_lib
from kosmos_jax.nn import _spmd
from kosmos_jax.nn.linear import default_kernel_init


def gate_up_init(kernel_init):
  """An initializer for a gate|up weight [..., hidden, 2, I] from a matrix initializer:
  `kernel_init` sees [..., hidden, 2*I], so its fan-in is hidden, as for two
  separate [hidden, I] kernels; the reshape puts gate at index 0, up at 1."""
  def init(key, shape, dtype):
    return kernel_init(key, (*shape[:-2], 2 * shape[-1]), dtype).reshape(shape)
  return init


class ParallelMLP(nnx.Module):
  """down(silu(gate(x)) * up(x)) with gate|up fused into one column-parallel GEMM.

  Params: `gate_up` [hidden, 2, intermediate] (index 0 gate, 1 up) sharded over tp on
  the last dim (each rank holds matching gate and up columns), `down`
  [intermediate, hidden] sharded over tp on the first; `kosmos_jax.nn.MoE` names and
  lays out its experts' weights the same way, with a leading expert axis. Called on
  global [batch, seq, hidden] arrays sequence-sharded over tp; returns the same layout.
  use_bias must stay False (no bias epilogue in the fused pair). `cu_cap`,
  `ag_config` (kosmos_jax.AgConfig) and `rs_config` (kosmos_jax.RsConfig) are the
  fused kernels' knobs, passed to `kosmos_jax.tp.parallel_swiglu_mlp` as they are;
  so is `precision` (every dot of both directions on the reference path; the fused
  kernels take only None).
  """

  def __init__(self, hidden: int, intermediate: int, *, mesh: jax.sharding.Mesh,
               tp_axis: str = "tp", dp_axis: str | None = None, use_bias: bool = False,
               dtype: Any = None, param_dtype: Any = jnp.float32, kernel_init=default_kernel_init,
               promote_dtype=dtypes.promote_dtype, impl: str | None = None, cu_cap: int | None = None,
               ag_config=None, rs_config=None, precision=None, rngs: nnx.Rngs):
    _spmd.check_module("ParallelMLP", impl=impl, use_bias=use_bias, hidden=hidden,
                       intermediate=intermediate)
    tp_lib._check_knobs("ParallelMLP", cu_cap, ag_config, rs_config)
    _spmd.check_axes(mesh, tp_axis=tp_axis, dp_axis=dp_axis)
    tp = mesh.shape[tp_axis]
    if intermediate % tp:
      raise ValueError(f"ParallelMLP: intermediate={intermediate} must be a multiple of the "
                       f"'{tp_axis}' axis size {tp}")
    self.hidden, self.intermediate = hidden, intermediate
    self.mesh, self.tp_axis, self.dp_axis = mesh, tp_axis, dp_axis
    self.dtype, self.param_dtype, self.impl = dtype, param_dtype, impl
    self.cu_cap, self.ag_config, self.rs_config = cu_cap, ag_config, rs_config
    self.precision = precision
    self.promote_dtype = promote_dtype
    self.gate_up = nnx.Param(nnx.with_partitioning(
        gate_up_init(kernel_init), (None, None, tp_axis), mesh=mesh)(
            rngs.params(), (hidden, 2, intermediate), param_dtype))
    self.down = nnx.Param(nnx.with_partitioning(kernel_init, (tp_axis, None), mesh=mesh)(
        rngs.params(), (intermediate, hidden), param_dtype))

  def __call__(self, x):
    _spmd.check_act("ParallelMLP", x, mesh=self.mesh, features=self.hidden,
                    dp_axis=self.dp_axis, seq_axis=self.tp_axis)
    tp, dp = self.tp_axis, self.dp_axis
    act = _spmd.act_spec(x.ndim, dp, tp, None)

    def local(x, w1, w2):
      return tp_lib.parallel_swiglu_mlp(x, w1, w2, axis_name=tp, impl=self.impl, cu_cap=self.cu_cap,
                                        ag_config=self.ag_config, rs_config=self.rs_config,
                                        precision=self.precision)

    args = self.promote_dtype((x, self.gate_up[...], self.down[...]), dtype=self.dtype)
    return _spmd.run_sharded(local, self.mesh, list(args), [act, P(None, None, tp), P(tp, None)], act)
