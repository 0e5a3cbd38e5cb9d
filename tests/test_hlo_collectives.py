"""The reference path issues exactly the collectives of the paper's Figure 5 pairing,
counted in the compiled HLO: forward one AG (column) / one RS (row); backward one AG
+ one RS (column) and one AG (row)."""
import re

import jax
import jax.numpy as jnp

from kosmos_jax import tp as tp_lib
from helpers import P, fresh, mesh, put

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "collective_permute")


def count(fn, *args):
  """Collectives in the lowered StableHLO: what the program issues, before XLA's CSE
  may merge the forward and backward gathers of the same tensor."""
  text = jax.jit(fn).lower(*args).as_text()
  return {k: len(re.findall(rf"stablehlo\.{k}\b|\"stablehlo\.{k}\"", text)) for k in KINDS}


def setup(kind):
  m = mesh(4)
  if kind == "column":
    x, w = put(fresh((2, 16, 8)), m, P(None, "tp", None)), put(fresh((8, 16)), m, P(None, "tp"))
    specs, out = (P(None, "tp", None), P(None, "tp")), P(None, None, "tp")
    fn = tp_lib.column_parallel_linear
  else:
    x, w = put(fresh((2, 16, 16)), m, P(None, None, "tp")), put(fresh((16, 8)), m, P("tp", None))
    specs, out = (P(None, None, "tp"), P("tp", None)), P(None, "tp", None)
    fn = tp_lib.row_parallel_linear
  f = jax.shard_map(lambda x, w: fn(x, w, axis_name="tp"), mesh=m, in_specs=specs, out_specs=out)
  return f, x, w


def expect(got, **want):
  full = {k: 0 for k in KINDS} | want
  assert got == full, f"collectives {got} != expected {full}"


def test_column_forward():
  f, x, w = setup("column")
  expect(count(f, x, w), all_gather=1)


def test_column_backward():
  f, x, w = setup("column")
  expect(count(jax.value_and_grad(lambda x, w: jnp.sum(f(x, w)), argnums=(0, 1)), x, w),
         all_gather=2, reduce_scatter=1)


def test_row_forward():
  f, x, w = setup("row")
  expect(count(f, x, w), reduce_scatter=1)


def test_row_backward():
  f, x, w = setup("row")
  expect(count(jax.value_and_grad(lambda x, w: jnp.sum(f(x, w)), argnums=(0, 1)), x, w),
         all_gather=1, reduce_scatter=1)
