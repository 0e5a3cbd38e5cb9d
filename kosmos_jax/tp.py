"""TP+SP linears with custom_vjp over the per-device ops (paper Figure 5).

Both functions are per-device: call them inside `jax.shard_map` over the TP axis
(the `kosmos_jax.nn` modules do). Activations outside the pair are sequence-sharded.
The gathered / scattered dimension is the sequence dimension just before the
features (axis -2); any leading batch dims are carried along, e.g. [batch, seq, hidden].
Each rank's input must be its own shard (varying over the TP axis): a replicated one
raises a ValueError, except under shard_map(check_vma=False), which hides replication
from the ops, so that there a replicated input gives a wrong answer without an error.

The backward rules use exactly the ops the paper pairs, so replacing a reference
twin by its fused kernel changes no rule:

  column parallel  fwd  AG x + TN            (ops.ag_tn)
                   bwd  bulk AG x || NN dgrad (ops.bulk_ag_nn)
                        bulk RS dx || NT wgrad (ops.bulk_rs_nt)
  row parallel     fwd  TN + RS y            (ops.tn_rs)
                   bwd  AG dy + NN dgrad, keeping AG(dy) (ops.ag_nn)
                        NT wgrad on the gathered dy      (ops.matmul)

Only the local (sequence-sharded) input is saved for the column-parallel backward;
it is gathered again there, beside the dgrad GEMM, as Megatron's SP does.
"""
from __future__ import annotations

import functools

import jax

from kosmos_jax import _compat, ops


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _column(x, w, axis_name, impl):
  return ops.ag_tn(x, w, axis_name=axis_name, impl=impl)


def _column_fwd(x, w, axis_name, impl):
  return ops.ag_tn(x, w, axis_name=axis_name, impl=impl), (x, w)


def _column_bwd(axis_name, impl, res, dy):
  x, w = res
  dy = _compat.pvary_to(dy, _compat.vma(x) | _compat.vma(w))
  x_g, dx_partial = ops.bulk_ag_nn(x, dy, w, axis_name=axis_name, impl=impl)
  dx, dw = ops.bulk_rs_nt(dx_partial, x_g, dy, axis_name=axis_name, impl=impl)
  return _compat.reduce_to_vma(dx, _compat.vma(x)), _compat.reduce_to_vma(dw, _compat.vma(w))


_column.defvjp(_column_fwd, _column_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _row(x, w, axis_name, impl):
  return ops.tn_rs(x, w, axis_name=axis_name, impl=impl)


def _row_fwd(x, w, axis_name, impl):
  return ops.tn_rs(x, w, axis_name=axis_name, impl=impl), (x, w)


def _row_bwd(axis_name, impl, res, dy):
  x, w = res
  dy = _compat.pvary_to(dy, _compat.vma(x) | _compat.vma(w))
  dx, dy_g = ops.ag_nn(dy, w, axis_name=axis_name, return_gathered=True, impl=impl)
  dw = ops.matmul(x, dy_g, layout="NT", impl=impl)
  return _compat.reduce_to_vma(dx, _compat.vma(x)), _compat.reduce_to_vma(dw, _compat.vma(w))


_row.defvjp(_row_fwd, _row_bwd)


def column_parallel_linear(x, w, axis_name, *, impl=None):
  """Column-parallel linear with sequence-parallel input.

  Args:
    x: [..., m_local, k], this rank's sequence shard (axis -2 is the sequence).
    w: [k, n_local], this rank's column shard of the weight.
    axis_name: the TP mesh axis (size tp), bound by an enclosing shard_map.
    impl: None (KOSMOS_IMPL), 'auto', 'reference' or 'fused'.
  Returns:
    [..., m_local * tp, n_local]: the full sequence, this rank's output columns.
  """
  return _column(x, w, axis_name, impl)


def row_parallel_linear(x, w, axis_name, *, impl=None):
  """Row-parallel linear with sequence-parallel output.

  Args:
    x: [..., m, k_local], the full sequence (axis -2), this rank's input columns.
    w: [k_local, n], this rank's row shard of the weight.
    axis_name: the TP mesh axis (size tp); m must be a multiple of tp.
    impl: None (KOSMOS_IMPL), 'auto', 'reference' or 'fused'.
  Returns:
    [..., m // tp, n]: this rank's sequence shard of the summed output.
  """
  return _row(x, w, axis_name, impl)


def parallel_swiglu_mlp(x, w_gate_up, w_down, axis_name, *, impl=None):
  """SwiGLU MLP as a TP+SP column/row pair: down(silu(gate(x)) * up(x)).

  Args:
    x: [..., m_local, h], this rank's sequence shard.
    w_gate_up: [h, 2, i_local], gate and up columns of this rank side by side, so
      one column-parallel GEMM (one all-gather) serves both.
    w_down: [i_local, h], this rank's rows of the down projection.
  Returns:
    [..., m_local, h], this rank's sequence shard.
  """
  h, two, i_local = w_gate_up.shape
  if two != 2:
    raise ValueError(f"w_gate_up.shape={tuple(w_gate_up.shape)} must be [hidden, 2, i_local]")
  gu = column_parallel_linear(x, w_gate_up.reshape(h, 2 * i_local), axis_name, impl=impl)
  gate, up = gu[..., :i_local], gu[..., i_local:]
  return row_parallel_linear(jax.nn.silu(gate) * up, w_down, axis_name, impl=impl)
