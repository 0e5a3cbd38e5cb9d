"""Flax NNX SwiGLU MLP as one TP+SP column/row pair (`kosmos_jax.tp.parallel_swiglu_mlp`)."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from kosmos_jax import tp as tp_lib
from kosmos_jax.nn import _spmd
from kosmos_jax.nn.linear import default_kernel_init


class ParallelMLP(nnx.Module):
  """down(silu(gate(x)) * up(x)) with gate|up fused into one column-parallel GEMM.

  Params: `gate_up` [hidden, 2, intermediate] sharded over tp on the last dim (each
  rank holds matching gate and up columns), `down` [intermediate, hidden] sharded
  over tp on the first. Called on global [batch, seq, hidden] arrays
  sequence-sharded over tp; returns the same layout.
  """

  def __init__(self, hidden: int, intermediate: int, *, mesh: jax.sharding.Mesh,
               tp_axis: str = "tp", dp_axis: str | None = None, dtype: Any = None,
               param_dtype: Any = jnp.float32, kernel_init=default_kernel_init,
               impl: str | None = None, rngs: nnx.Rngs):
    _spmd.check_axes(mesh, tp_axis=tp_axis, dp_axis=dp_axis)
    tp = mesh.shape[tp_axis]
    if intermediate % tp:
      raise ValueError(f"ParallelMLP: intermediate={intermediate} must be a multiple of the "
                       f"'{tp_axis}' axis size {tp}")
    self.hidden, self.intermediate = hidden, intermediate
    self.mesh, self.tp_axis, self.dp_axis = mesh, tp_axis, dp_axis
    self.dtype, self.param_dtype, self.impl = dtype, param_dtype, impl

    def gate_up_init(key, shape, dtype):  # fan-in is hidden, as for two separate [h, i] kernels
      return kernel_init(key, (hidden, 2 * intermediate), dtype).reshape(shape)

    self.gate_up = nnx.Param(nnx.with_partitioning(gate_up_init, (None, None, tp_axis), mesh=mesh)(
        rngs.params(), (hidden, 2, intermediate), param_dtype))
    self.down = nnx.Param(nnx.with_partitioning(kernel_init, (tp_axis, None), mesh=mesh)(
        rngs.params(), (intermediate, hidden), param_dtype))

  def __call__(self, x):
    _spmd.check_act("ParallelMLP", x, mesh=self.mesh, features=self.hidden,
                    dp_axis=self.dp_axis, seq_axis=self.tp_axis)
    dt = jnp.dtype(self.dtype) if self.dtype is not None else jnp.result_type(x.dtype, self.param_dtype)
    tp, dp = self.tp_axis, self.dp_axis
    act = _spmd.act_spec(x.ndim, dp, tp, None)

    def local(x, w1, w2):
      return tp_lib.parallel_swiglu_mlp(x, w1, w2, tp, impl=self.impl)

    args = [x.astype(dt), self.gate_up[...].astype(dt), self.down[...].astype(dt)]
    return _spmd.run_sharded(local, self.mesh, args, [act, P(None, None, tp), P(tp, None)], act)
