"""Per-device TP+SP collective-GEMM ops (paper Table B.2), called inside shard_map.

Each op validates its operands (errors name the values, raised before lowering),
then runs the fused FFI kernel or its reference twin (`kosmos_jax.reference`), as
`impl` / KOSMOS_IMPL decide. Shapes (per device; tp = size of `axis_name`; the
gathered/scattered axis is the sequence axis -2; leading batch dims allowed):

  op          collective   GEMM  inputs                                 outputs
  ag_tn       AG x         TN    x [..,m/tp,k], w [k,n]                 y [..,m,n]
  tn_rs       RS y         TN    x [..,m,k], w [k,n]                    y [..,m/tp,n]
  ag_nn       AG dy        NN    dy [..,m/tp,n], w [k,n]                dx [..,m,k] (+ AG(dy))
  bulk_ag_nn  AG x  ||     NN    x [..,m/tp,k], dy [..,m,n], w [k,n]    AG(x), dy@w.T
  bulk_rs_nt  RS dx ||     NT    dxp [..,m,k], xg [..,m,k], dy [..,m,n] RS(dxp), xg.T@dy

`precision` (jax.lax.dot_general's) reaches the reference path's dots; the fused
kernels multiply the operands as given with fp32 accumulation, so a precision
other than None with them is a ValueError.

`cu_cap` limits the fused kernel's grid to that many SMs (paper §3.1.2), and
`config` carries the other launch knobs, one type per op family
(`kosmos_jax.kernel_config`, exported as `kosmos_jax.AgConfig` / `RsConfig`):

  ag_tn, ag_nn, bulk_ag_nn, bulk_rs_nt   AgConfig (movers, switching, transport)
  tn_rs                                  RsConfig (reducers, stage, switching,
                                                   band_rows, transport)

cu_cap may be given either way; given both ways, the two must agree. The reference
path checks the config's type and that its knobs apply to the op (transport="push"
exists only for ag_tn; tn_rs has all its transports), then ignores it, as it
ignores cu_cap, so a program configured for the GPU runs unchanged on CPU.

Every op raises a ValueError, before lowering, when an operand has a zero-size
dimension, or when the operand it gathers or reduce-scatters does not vary over
`axis_name` (a replicated activation would be gathered, or summed, tp times). The
second check needs shard_map's varying-axes typing: under check_vma=False it cannot
see replication, and such an operand gives a wrong answer without an error.
"""
from __future__ import annotations

import dataclasses
import functools

from kosmos_jax import reference
from kosmos_jax.kernel_config import AgConfig, RsConfig
from kosmos_jax.ops import _checks as chk
from kosmos_jax.ops._dispatch import choose, run_fused

CONFIG_TYPES = {"ag_tn": AgConfig, "ag_nn": AgConfig, "bulk_ag_nn": AgConfig, "bulk_rs_nt": AgConfig,
                "tn_rs": RsConfig}
# AgConfig.transport="push" exists only in ag_tn's kernel: ag_nn and bulk_ag_nn gather
# by pull (their movers write the gathered output), bulk_rs_nt's reduce-scatter always pushes.
PULL_ONLY = ("ag_nn", "bulk_ag_nn", "bulk_rs_nt")


def check_cap(op: str, cu_cap) -> None:
  if cu_cap is not None and (not isinstance(cu_cap, int) or isinstance(cu_cap, bool) or cu_cap < 1):
    raise ValueError(f"{op}: cu_cap={cu_cap!r} must be a positive int or None")


def resolve_config(op: str, config, cu_cap):
  """`op`'s launch config with cu_cap merged in: the type checked, cu_cap given
  twice only if the values agree, and knobs that `op` does not have refused."""
  want = CONFIG_TYPES[op]
  check_cap(op, cu_cap)
  if config is None:
    config = want()
  elif type(config) is not want:
    raise TypeError(f"{op}: config={config!r} must be of type {want.__name__} (or None): "
                    f"{op}'s launch knobs are {want.__name__}'s")
  if cu_cap is not None and config.cu_cap is not None and cu_cap != config.cu_cap:
    raise ValueError(f"{op}: cu_cap={cu_cap} conflicts with config.cu_cap={config.cu_cap}; give one, "
                     "or the same value in both")
  if op in PULL_ONLY and config.transport != "pull":
    raise ValueError(f"{op}: config.transport={config.transport!r} is not supported; only ag_tn has a "
                     f"push transport ({op} {'always pushes' if op == 'bulk_rs_nt' else 'gathers by pull'}), "
                     "so leave AgConfig.transport at 'pull'")
  if cu_cap is not None and config.cu_cap is None:
    config = dataclasses.replace(config, cu_cap=cu_cap)
  return config


def check_precision(op: str, precision) -> None:
  """A fused kernel multiplies at its operands' own precision with fp32
  accumulation; another precision asked of it is an error, not ignored."""
  if precision is not None:
    raise ValueError(f"{op}: precision={precision!r} applies to the reference path's dots only; the fused "
                     "kernel multiplies the operands as given with fp32 accumulation. Pass precision=None, "
                     "or impl='reference' for another precision")


def _run(op: str, impl, args: tuple, kwargs: dict, config, precision=None):
  twin = functools.partial(getattr(reference, op), **kwargs, precision=precision)
  if choose(op, impl) == "fused":
    check_precision(op, precision)
    return run_fused(op, twin, args, dict(kwargs, config=config))
  return twin(*args)


def ag_tn(x, w, *, axis_name, impl=None, cu_cap=None, config=None, precision=None):
  """Y = all_gather_rows(x) @ w: the column-parallel forward. config: AgConfig."""
  op = "ag_tn"
  tp = chk.axis_size(op, axis_name)
  chk.dtypes(op, x=x, w=w)
  chk.ndim_at_least(op, "x", x, 2)
  chk.rank2(op, "w", w)
  chk.nonempty(op, x=x, w=w)
  chk.varies(op, "x", x, axis_name, tp, "P(..., {axis}, None) (sequence-sharded)",
             f"be gathered {tp} times (a sequence {tp}x too long)")
  chk.equal(op, "contraction sizes", **{"x.shape[-1]": x.shape[-1], "w.shape[0]": w.shape[0]})
  cfg = resolve_config(op, config, cu_cap)
  return _run(op, impl, (x, w), dict(axis_name=axis_name), cfg, precision)


def tn_rs(x, w, *, axis_name, impl=None, cu_cap=None, config=None, precision=None):
  """Y = reduce_scatter_rows(x @ w), summed in fp32: the row-parallel forward.
  config: RsConfig."""
  op = "tn_rs"
  tp = chk.axis_size(op, axis_name)
  chk.dtypes(op, x=x, w=w)
  chk.ndim_at_least(op, "x", x, 2)
  chk.rank2(op, "w", w)
  chk.nonempty(op, x=x, w=w)
  chk.varies(op, "x", x, axis_name, tp, "P(..., None, {axis}) (feature-sharded)",
             f"be summed {tp} times")
  chk.equal(op, "contraction sizes", **{"x.shape[-1]": x.shape[-1], "w.shape[0]": w.shape[0]})
  chk.divisible(op, "m", x.shape[-2], "tp", tp)
  cfg = resolve_config(op, config, cu_cap)
  return _run(op, impl, (x, w), dict(axis_name=axis_name), cfg, precision)


def ag_nn(dy, w, *, axis_name, return_gathered=False, impl=None, cu_cap=None, config=None, precision=None):
  """dX = all_gather_rows(dy) @ w.T: the row-parallel data gradient; with
  `return_gathered` also returns the gathered dy for the weight gradient.
  config: AgConfig with transport='pull' (the fused kernel gathers by pull)."""
  op = "ag_nn"
  tp = chk.axis_size(op, axis_name)
  chk.dtypes(op, dy=dy, w=w)
  chk.ndim_at_least(op, "dy", dy, 2)
  chk.rank2(op, "w", w)
  chk.nonempty(op, dy=dy, w=w)
  chk.varies(op, "dy", dy, axis_name, tp, "P(..., {axis}, None) (sequence-sharded)",
             f"be gathered {tp} times (a sequence {tp}x too long)")
  chk.equal(op, "output widths", **{"dy.shape[-1]": dy.shape[-1], "w.shape[1]": w.shape[1]})
  cfg = resolve_config(op, config, cu_cap)
  return _run(op, impl, (dy, w), dict(axis_name=axis_name, return_gathered=bool(return_gathered)), cfg,
              precision)


def bulk_ag_nn(x, dy, w, *, axis_name, impl=None, cu_cap=None, config=None, precision=None):
  """(all_gather_rows(x), dy @ w.T): the column-parallel data gradient beside the
  gather of the saved input that the weight gradient needs. config: AgConfig with
  transport='pull' (movers pull peers' rows straight into the gathered output)."""
  op = "bulk_ag_nn"
  tp = chk.axis_size(op, axis_name)
  chk.dtypes(op, x=x, dy=dy, w=w)
  chk.ndim_at_least(op, "x", x, 2)
  chk.ndim_at_least(op, "dy", dy, 2)
  chk.rank2(op, "w", w)
  chk.nonempty(op, x=x, dy=dy, w=w)
  chk.varies(op, "x", x, axis_name, tp, "P(..., {axis}, None) (sequence-sharded)",
             f"be gathered {tp} times (a sequence {tp}x too long)")
  chk.same_leading(op, x=x, dy=dy)
  chk.equal(op, "input widths", **{"x.shape[-1]": x.shape[-1], "w.shape[0]": w.shape[0]})
  chk.equal(op, "output widths", **{"dy.shape[-1]": dy.shape[-1], "w.shape[1]": w.shape[1]})
  chk.equal(op, "gathered rows", **{"x.shape[-2]*tp": x.shape[-2] * tp, "dy.shape[-2]": dy.shape[-2]})
  cfg = resolve_config(op, config, cu_cap)
  return _run(op, impl, (x, dy, w), dict(axis_name=axis_name), cfg, precision)


def bulk_rs_nt(dx_partial, x_gathered, dy, *, axis_name, impl=None, cu_cap=None, config=None, precision=None):
  """(reduce_scatter_rows(dx_partial), x_gathered.T @ dy): the column-parallel
  weight gradient beside the reduce-scatter of the data gradient. config: AgConfig,
  whose movers are the CTAs that start pushing dx_partial's bands to their owners
  (transport stays 'pull': this reduce-scatter always pushes, there is no choice)."""
  op = "bulk_rs_nt"
  tp = chk.axis_size(op, axis_name)
  chk.dtypes(op, dx_partial=dx_partial, x_gathered=x_gathered, dy=dy)
  for name, a in (("dx_partial", dx_partial), ("x_gathered", x_gathered), ("dy", dy)):
    chk.ndim_at_least(op, name, a, 2)
  chk.nonempty(op, dx_partial=dx_partial, x_gathered=x_gathered, dy=dy)
  chk.varies(op, "dx_partial", dx_partial, axis_name, tp, "P(..., None, {axis}) (each rank's "
             "partial sum)", f"be summed {tp} times")
  chk.same_leading(op, dx_partial=dx_partial, x_gathered=x_gathered, dy=dy)
  chk.equal(op, "rows", **{"dx_partial.shape[-2]": dx_partial.shape[-2],
                           "x_gathered.shape[-2]": x_gathered.shape[-2], "dy.shape[-2]": dy.shape[-2]})
  chk.equal(op, "input widths", **{"dx_partial.shape[-1]": dx_partial.shape[-1],
                                   "x_gathered.shape[-1]": x_gathered.shape[-1]})
  chk.divisible(op, "m", dx_partial.shape[-2], "tp", tp)
  cfg = resolve_config(op, config, cu_cap)
  return _run(op, impl, (dx_partial, x_gathered, dy), dict(axis_name=axis_name), cfg, precision)
