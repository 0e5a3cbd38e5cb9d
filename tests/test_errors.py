"""Bad input raises ValueError / TypeError naming the offending values, before lowering."""
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from kosmos_jax import nn as knn
from kosmos_jax import ops, tp as tp_lib
from helpers import P, fresh, mesh, put


def in_shard_map(fn, *arrays, tp=4, specs=None):
  m = mesh(tp)
  specs = specs or tuple(P() for _ in arrays)
  f = jax.shard_map(fn, mesh=m, in_specs=specs, out_specs=P(), check_vma=False)
  return jax.jit(f).lower(*[put(a, m, s) for a, s in zip(arrays, specs)])


def test_outside_shard_map():
  with pytest.raises(ValueError, match=r"axis_name='tp' is not bound.*shard_map"):
    ops.ag_tn(fresh((8, 4)), fresh((4, 4)), axis_name="tp")
  with pytest.raises(ValueError, match="not bound"):
    tp_lib.row_parallel_linear(fresh((8, 4)), fresh((4, 4)), axis_name="tp")


def test_unknown_axis_name():
  with pytest.raises(ValueError, match=r"axis_name='model' is not bound"):
    in_shard_map(lambda x, w: ops.ag_tn(x, w, axis_name="model"), fresh((8, 4)), fresh((4, 4)))
  with pytest.raises(ValueError, match=r"axis_name=3 must be a mesh axis name"):
    in_shard_map(lambda x, w: ops.ag_tn(x, w, axis_name=3), fresh((8, 4)), fresh((4, 4)))


def test_contraction_mismatch():
  with pytest.raises(ValueError, match=r"x.shape\[-1\]=4, w.shape\[0\]=5"):
    in_shard_map(lambda x, w: ops.ag_tn(x, w, axis_name="tp"), fresh((8, 4)), fresh((5, 4)))
  with pytest.raises(ValueError, match=r"dy.shape\[-1\]=4, w.shape\[1\]=3"):
    in_shard_map(lambda d, w: ops.ag_nn(d, w, axis_name="tp"), fresh((8, 4)), fresh((5, 3)))


def test_rows_not_divisible_by_tp():
  with pytest.raises(ValueError, match=r"m=6 must be a multiple of tp=4"):
    in_shard_map(lambda x, w: ops.tn_rs(x, w, axis_name="tp"), fresh((6, 4)), fresh((4, 4)))
  with pytest.raises(ValueError, match=r"m=6 must be a multiple of tp=4"):
    in_shard_map(lambda a, b, c: ops.bulk_rs_nt(a, b, c, axis_name="tp"),
                 fresh((6, 4)), fresh((6, 4)), fresh((6, 2)))


def test_gathered_rows_mismatch():
  with pytest.raises(ValueError, match=r"x.shape\[-2\]\*tp=32, dy.shape\[-2\]=16"):
    in_shard_map(lambda x, d, w: ops.bulk_ag_nn(x, d, w, axis_name="tp"),
                 fresh((8, 4)), fresh((16, 2)), fresh((4, 2)))


def test_unsupported_and_mixed_dtypes():
  with pytest.raises(TypeError, match=r"x.dtype=int32 is not supported"):
    in_shard_map(lambda x, w: ops.ag_tn(x, w, axis_name="tp"),
                 jnp.ones((8, 4), jnp.int32), jnp.ones((4, 4), jnp.int32))
  with pytest.raises(TypeError, match=r"x.dtype=float32, w.dtype=bfloat16"):
    in_shard_map(lambda x, w: ops.ag_tn(x, w, axis_name="tp"),
                 fresh((8, 4)), fresh((4, 4), jnp.bfloat16))


def test_bad_rank_and_knobs():
  with pytest.raises(ValueError, match=r"w must be 2-D, got w.shape=\(4, 4, 1\)"):
    in_shard_map(lambda x, w: ops.ag_tn(x, w, axis_name="tp"), fresh((8, 4)), fresh((4, 4, 1)))
  with pytest.raises(ValueError, match=r"cu_cap=0 must be a positive int"):
    in_shard_map(lambda x, w: ops.ag_tn(x, w, axis_name="tp", cu_cap=0), fresh((8, 4)), fresh((4, 4)))
  with pytest.raises(ValueError, match=r"layout='TT' must be one of"):
    ops.matmul(fresh((4, 4)), fresh((4, 4)), layout="TT")
  with pytest.raises(ValueError, match=r"impl='fast' must be one of"):
    in_shard_map(lambda x, w: ops.ag_tn(x, w, axis_name="tp", impl="fast"), fresh((8, 4)), fresh((4, 4)))


def test_module_errors():
  m = mesh(4)
  with pytest.raises(ValueError, match=r"tp_axis='model' is not an axis of the mesh"):
    knn.ColumnParallelLinear(8, 8, mesh=m, tp_axis="model", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"out_features=6 must be a multiple of the 'tp' axis size 4"):
    knn.ColumnParallelLinear(8, 6, mesh=m, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"intermediate=10 must be a multiple"):
    knn.ParallelMLP(8, 10, mesh=m, rngs=nnx.Rngs(0))
  layer = knn.RowParallelLinear(8, 8, mesh=m, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"x.shape\[-1\]=6 must equal in_features=8"):
    layer(fresh((2, 8, 6)))
  with pytest.raises(ValueError, match=r"seq=6 must be a multiple of the 'tp' axis size 4"):
    layer(fresh((2, 6, 8)))


def _lower_checked(fn, arrays, specs, out_spec, tp=4, dp=1):
  """Lower `fn` under shard_map with shard_map's default varying-axes typing."""
  m = mesh(tp, dp)
  f = jax.shard_map(fn, mesh=m, in_specs=specs, out_specs=out_spec)
  return jax.jit(f).lower(*[put(a, m, s) for a, s in zip(arrays, specs)])


def test_replicated_sequence_input_raises():
  """Issue 24.1: a replicated x used to give tp x (x @ w) (row) or a sequence tp
  times too long (column), silently."""
  x, w = fresh((2, 8, 4)), fresh((4, 4))
  rep = P("dp", None, None)
  with pytest.raises(ValueError, match=r"tn_rs: x does not vary over axis_name='tp' \(it varies "
                                       r"over \['dp'\]\).*P\(\.\.\., None, 'tp'\).*summed 4 times"):
    _lower_checked(lambda x, w: tp_lib.row_parallel_linear(x, w, axis_name="tp"), (x, w), (rep, P()),
                   P("dp", "tp", None))
  with pytest.raises(ValueError, match=r"ag_tn: x does not vary over axis_name='tp'.*"
                                       r"P\(\.\.\., 'tp', None\).*gathered 4 times"):
    _lower_checked(lambda x, w: tp_lib.column_parallel_linear(x, w, axis_name="tp"), (x, w), (rep, P()),
                   P("dp", None, "tp"))
  with pytest.raises(ValueError, match=r"ag_nn: dy does not vary"):
    _lower_checked(lambda d, w: ops.ag_nn(d, w, axis_name="tp"), (x, w), (rep, P()), rep)
  with pytest.raises(ValueError, match=r"bulk_ag_nn: x does not vary"):
    _lower_checked(lambda x, d, w: ops.bulk_ag_nn(x, d, w, axis_name="tp")[1],
                   (x, fresh((2, 32, 4)), w), (rep, rep, P()), rep)
  with pytest.raises(ValueError, match=r"bulk_rs_nt: dx_partial does not vary"):
    _lower_checked(lambda a, b, c: ops.bulk_rs_nt(a, b, c, axis_name="tp")[1],
                   (x, x, x), (rep, rep, rep), P())
  # Sharded as documented, and replicated at tp = 1 (the same thing there), both lower.
  _lower_checked(lambda x, w: tp_lib.row_parallel_linear(x, w, axis_name="tp"), (x, w),
                 (P("dp", None, "tp"), P("tp", None)), P("dp", "tp", None))
  _lower_checked(lambda x, w: tp_lib.column_parallel_linear(x, w, axis_name="tp"), (x, w), (rep, P()),
                 P("dp", None, "tp"), tp=1)


def test_zero_size_dims_raise_before_lowering():
  """Issue 24.2: zero-size dims used to fail in lowering ("verifier errors") or compile."""
  m = mesh(4)
  with jax.set_mesh(m):
    col = knn.ColumnParallelLinear(32, 8, mesh=m, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"x.shape=\(4, 0, 32\) has a zero-size dimension"):
      nnx.jit(lambda mdl, x: mdl(x))(col, jnp.ones((4, 0, 32)))
  seq = (P("tp", None), P())
  with pytest.raises(ValueError, match=r"ag_tn: x.shape=\(2, 0\) has a zero-size dimension"):
    _lower_checked(lambda x, w: ops.ag_tn(x, w, axis_name="tp"),
                   (jnp.ones((8, 0)), jnp.ones((0, 4))), seq, P())
  with pytest.raises(ValueError, match=r"tn_rs: w.shape=\(4, 0\) has a zero-size dimension"):
    _lower_checked(lambda x, w: ops.tn_rs(x, w, axis_name="tp"),
                   (fresh((8, 16)), jnp.ones((16, 0))), (P(None, "tp"), P("tp", None)), P())
  with pytest.raises(ValueError, match=r"in_features=0 must be a positive int"):
    knn.ColumnParallelLinear(0, 8, mesh=m, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"intermediate=0 must be a positive int"):
    knn.ParallelMLP(8, 0, mesh=m, rngs=nnx.Rngs(0))


def test_module_impl_checked_at_construction():
  """Issue 24.6: impl='bogus' used to pass the constructor and fail on the first call."""
  m = mesh(4)
  for make in (lambda **kw: knn.ColumnParallelLinear(8, 8, mesh=m, **kw),
               lambda **kw: knn.RowParallelLinear(8, 8, mesh=m, **kw),
               lambda **kw: knn.ParallelMLP(8, 8, mesh=m, **kw)):
    with pytest.raises(ValueError, match=r"impl='bogus' must be one of \('auto', 'reference', 'fused'\)"):
      make(impl="bogus", rngs=nnx.Rngs(0))
    make(impl="reference", rngs=nnx.Rngs(0))


def test_bias_and_precision_where_unsupported():
  m = mesh(4)
  with pytest.raises(ValueError, match=r"ParallelMLP: use_bias=True is not supported"):
    knn.ParallelMLP(8, 8, mesh=m, use_bias=True, rngs=nnx.Rngs(0))
