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

Kernel knobs (keyword-only, like axis_name and impl; every function takes all of
them, so one set can be passed to every layer of a model):
  cu_cap     at most this many SMs for every fused op of the layer (and its matmul)
  ag_config  AgConfig for ag_tn, bulk_ag_nn and bulk_rs_nt (column pair) and ag_nn
             (row pair). Its transport applies to ag_tn only, the one AG kernel with
             a push: the other three get the config with transport="pull" (they
             gather by pull, or, bulk_rs_nt, always push).
  rs_config  RsConfig for tn_rs (row pair); the column pair runs no GEMM+RS of that
             family, so there only its type is checked.
The reference path checks them all and ignores them (`kosmos_jax.ops`). They are
frozen dataclasses, hence hashable: the custom_vjp rules carry them as static
arguments.
"""
from __future__ import annotations

import dataclasses
import functools

import jax

from kosmos_jax import _compat, ops
from kosmos_jax.kernel_config import AgConfig, RsConfig
from kosmos_jax.ops.tp import check_cap


def _check_knobs(name: str, cu_cap, ag_config, rs_config):
  """Every knob at the layer's entry, so that a bad backward config fails on the
  forward call too (its ops would see it only under jax.grad)."""
  check_cap(name, cu_cap)
  for what, cfg, want in (("ag_config", ag_config, AgConfig), ("rs_config", rs_config, RsConfig)):
    if cfg is None:
      continue
    if type(cfg) is not want:
      raise TypeError(f"{name}: {what}={cfg!r} must be of type {want.__name__} (or None)")
    if cu_cap is not None and cfg.cu_cap is not None and cfg.cu_cap != cu_cap:
      raise ValueError(f"{name}: cu_cap={cu_cap} conflicts with {what}.cu_cap={cfg.cu_cap}; give one, "
                       "or the same value in both")


def _pull(ag_config):
  # The AG ops other than ag_tn have no push transport (see the module doc).
  return None if ag_config is None else dataclasses.replace(ag_config, transport="pull")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6))
def _column(x, w, axis_name, impl, cu_cap, ag_config, precision):
  return ops.ag_tn(x, w, axis_name=axis_name, impl=impl, cu_cap=cu_cap, config=ag_config, precision=precision)


def _column_fwd(x, w, axis_name, impl, cu_cap, ag_config, precision):
  return _column(x, w, axis_name, impl, cu_cap, ag_config, precision), (x, w)


def _column_bwd(axis_name, impl, cu_cap, ag_config, precision, res, dy):
  x, w = res
  dy = _compat.pvary_to(dy, _compat.vma(x) | _compat.vma(w))
  kw = dict(axis_name=axis_name, impl=impl, cu_cap=cu_cap, config=_pull(ag_config), precision=precision)
  x_g, dx_partial = ops.bulk_ag_nn(x, dy, w, **kw)
  dx, dw = ops.bulk_rs_nt(dx_partial, x_g, dy, **kw)
  return _compat.reduce_to_vma(dx, _compat.vma(x)), _compat.reduce_to_vma(dw, _compat.vma(w))


_column.defvjp(_column_fwd, _column_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6, 7))
def _row(x, w, axis_name, impl, cu_cap, ag_config, rs_config, precision):
  return ops.tn_rs(x, w, axis_name=axis_name, impl=impl, cu_cap=cu_cap, config=rs_config, precision=precision)


def _row_fwd(x, w, axis_name, impl, cu_cap, ag_config, rs_config, precision):
  return _row(x, w, axis_name, impl, cu_cap, ag_config, rs_config, precision), (x, w)


def _row_bwd(axis_name, impl, cu_cap, ag_config, rs_config, precision, res, dy):
  x, w = res
  dy = _compat.pvary_to(dy, _compat.vma(x) | _compat.vma(w))
  dx, dy_g = ops.ag_nn(dy, w, axis_name=axis_name, return_gathered=True, impl=impl, cu_cap=cu_cap,
                       config=_pull(ag_config), precision=precision)
  dw = ops.matmul(x, dy_g, layout="NT", impl=impl, cu_cap=cu_cap, precision=precision)
  return _compat.reduce_to_vma(dx, _compat.vma(x)), _compat.reduce_to_vma(dw, _compat.vma(w))


_row.defvjp(_row_fwd, _row_bwd)

def column_parallel_linear(x, w, *, axis_name, impl=None, cu_cap=None, ag_config=None, rs_config=None,
                           precision=None):
  """Column-parallel linear with sequence-parallel input.

  Args:
    x: [..., m_local, k], this rank's sequence shard (axis -2 is the sequence).
    w: [k, n_local], this rank's column shard of the weight.
    axis_name: the TP mesh axis (size tp), bound by an enclosing shard_map.
    impl: None (KOSMOS_IMPL), 'auto', 'reference' or 'fused'.
    cu_cap, ag_config: at most cu_cap SMs, and AgConfig, for ag_tn (forward),
      bulk_ag_nn and bulk_rs_nt (backward; those with transport='pull').
    rs_config: RsConfig, only type-checked here (no GEMM+RS in this pair).
    precision: jax.lax.dot_general's, for every dot of both directions on the
      reference path (None: JAX's default); the fused kernels take only None.
  Returns:
    [..., m_local * tp, n_local]: the full sequence, this rank's output columns.
  """
  _check_knobs("column_parallel_linear", cu_cap, ag_config, rs_config)
  return _column(x, w, axis_name, impl, cu_cap, ag_config, precision)


def row_parallel_linear(x, w, *, axis_name, impl=None, cu_cap=None, ag_config=None, rs_config=None,
                        precision=None):
  """Row-parallel linear with sequence-parallel output.

  Args:
    x: [..., m, k_local], the full sequence (axis -2), this rank's input columns.
    w: [k_local, n], this rank's row shard of the weight.
    axis_name: the TP mesh axis (size tp); m must be a multiple of tp.
    impl: None (KOSMOS_IMPL), 'auto', 'reference' or 'fused'.
    cu_cap: at most this many SMs for tn_rs, ag_nn and the weight-gradient matmul.
    ag_config: AgConfig for ag_nn (backward), given with transport='pull'.
    rs_config: RsConfig for tn_rs (forward).
    precision: as for column_parallel_linear.
  Returns:
    [..., m // tp, n]: this rank's sequence shard of the summed output.
  """
  _check_knobs("row_parallel_linear", cu_cap, ag_config, rs_config)
  return _row(x, w, axis_name, impl, cu_cap, ag_config, rs_config, precision)


def parallel_swiglu_mlp(x, w_gate_up, w_down, *, axis_name, impl=None, cu_cap=None, ag_config=None,
                        rs_config=None, precision=None):
  """SwiGLU MLP as a TP+SP column/row pair: down(silu(gate(x)) * up(x)).

  Args:
    x: [..., m_local, h], this rank's sequence shard.
    w_gate_up: [h, 2, i_local], gate and up columns of this rank side by side, so
      one column-parallel GEMM (one all-gather) serves both.
    w_down: [i_local, h], this rank's rows of the down projection.
    axis_name, impl, cu_cap, ag_config, rs_config, precision: as for the two linears, which
      get them all (ag_config serves both, rs_config the row pair's tn_rs).
  Returns:
    [..., m_local, h], this rank's sequence shard.
  """
  h, two, i_local = w_gate_up.shape
  if two != 2:
    raise ValueError(f"w_gate_up.shape={tuple(w_gate_up.shape)} must be [hidden, 2, i_local]")
  kw = dict(axis_name=axis_name, impl=impl, cu_cap=cu_cap, ag_config=ag_config, rs_config=rs_config,
            precision=precision)
  gu = column_parallel_linear(x, w_gate_up.reshape(h, 2 * i_local), **kw)
  gate, up = gu[..., :i_local], gu[..., i_local:]
  return row_parallel_linear(jax.nn.silu(gate) * up, w_down, **kw)
