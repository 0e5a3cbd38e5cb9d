"""`precision` on the TP+SP path (issue 23.5): it reaches every dot of both
directions of the linears on the reference path, from the functional layer and
from the nn modules; a fused kernel, which multiplies the operands as given with
fp32 accumulation, refuses another precision instead of ignoring it."""
import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from kosmos_jax import nn as knn
from kosmos_jax import ops, reference, tp
from kosmos_jax.testing import fake_fused
from helpers import P, fresh, mesh

HI = jax.lax.Precision.HIGHEST


def _dots(f, *args):
  text = jax.jit(f).lower(*args).as_text()
  return re.findall(r"stablehlo.dot_general.*", text)


def test_precision_reaches_every_dot_of_the_pair():
  m = mesh(4)
  specs = (P(None, "tp", None), P(None, "tp"), P("tp", None))

  def loss(x, w1, w2, precision):
    h = tp.column_parallel_linear(x, w1, axis_name="tp", precision=precision)
    y = tp.row_parallel_linear(h, w2, axis_name="tp", precision=precision)
    return jnp.sum(y ** 2)

  args = (fresh((2, 16, 8)), fresh((8, 12)), fresh((12, 8)))
  for precision, want in ((HI, "HIGHEST"), (None, None)):
    f = jax.shard_map(jax.grad(lambda *a: loss(*a, precision), argnums=(0, 1, 2)), mesh=m,
                      in_specs=specs, out_specs=specs)
    dots = _dots(f, *args)
    assert len(dots) >= 6, dots  # 2 forward, 4 backward
    if want:
      assert all(want in d for d in dots), [d for d in dots if want not in d][:2]
    else:
      assert not any("HIGHEST" in d for d in dots)


def test_modules_pass_precision():
  m = mesh(4, dp=2)
  with jax.set_mesh(m):
    mlp = knn.ParallelMLP(8, 16, mesh=m, dp_axis="dp", precision=HI, rngs=nnx.Rngs(0))
    col = knn.ColumnParallelLinear(8, 16, mesh=m, dp_axis="dp", precision=HI, rngs=nnx.Rngs(1))
    x = jnp.ones((2, 16, 8))
    for mod in (mlp, col):
      dots = _dots(lambda a: mod(a), x)
      assert dots and all("HIGHEST" in d for d in dots), (type(mod).__name__, dots[:2])


def test_fused_kernels_refuse_a_precision():
  m = mesh(2)
  stand_in = lambda x, w, **kw: reference.ag_tn(x, w, axis_name=kw["axis_name"])
  matmul = lambda a, b, **kw: reference.matmul(a, b, layout=kw["layout"])
  with fake_fused({"ag_tn": stand_in, "matmul": matmul}):
    f = jax.shard_map(lambda x, w: ops.ag_tn(x, w, axis_name="tp", impl="fused", precision=HI), mesh=m,
                      in_specs=(P("tp", None), P()), out_specs=P())
    with pytest.raises(ValueError, match="precision=.*fused"):
      jax.jit(f).lower(fresh((8, 4)), fresh((4, 4)))
    with pytest.raises(ValueError, match="precision=.*fused"):
      ops.matmul(fresh((8, 4)), fresh((4, 4)), layout="TN", impl="fused", precision=HI)
