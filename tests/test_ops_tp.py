"""Each TP+SP op against its reference twin and a single-device dense oracle (NumPy,
float64), forward, for fp32/bf16, tp = 1, 2, 4, 8, with a leading batch dim."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kosmos_jax import ops, reference
from helpers import P, assert_close, fresh, mesh, put, shard_map

TPS = [1, 2, 4, 8]
DTYPES = [jnp.float32, jnp.bfloat16]
B, M, K, N = 2, 16, 24, 8  # M rows in total (gathered), K and N per rank


def np64(a):
  return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


def run(fn, tp, args, in_specs, out_specs):
  m = mesh(tp)
  args = [put(a, m, s) for a, s in zip(args, in_specs)]
  return shard_map(fn, m, in_specs, out_specs)(*args)


def both(op):
  """(kosmos op, twin) as per-device functions of the same signature."""
  return getattr(ops, op), getattr(reference, op)


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ag_tn(tp, dtype):
  x, w = fresh((B, M, K), dtype), fresh((K, N * tp), dtype)
  specs = (P(None, "tp", None), P(None, "tp"))
  dense = np64(x) @ np64(w)
  for fn in both("ag_tn"):
    y = run(lambda x, w: fn(x, w, axis_name="tp"), tp, (x, w), specs, P(None, None, "tp"))
    assert y.dtype == dtype and y.shape == (B, M, N * tp)
    assert_close(y, dense, dtype, what=f"ag_tn {fn.__module__}")


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_tn_rs(tp, dtype):
  x, w = fresh((B, M, K * tp), dtype), fresh((K * tp, N), dtype)
  specs = (P(None, None, "tp"), P("tp", None))
  dense = np64(x) @ np64(w)
  for fn in both("tn_rs"):
    y = run(lambda x, w: fn(x, w, axis_name="tp"), tp, (x, w), specs, P(None, "tp", None))
    assert y.dtype == dtype and y.shape == (B, M, N)
    assert_close(y, dense, dtype, what=f"tn_rs {fn.__module__}")


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ag_nn(tp, dtype):
  dy, w = fresh((B, M, N), dtype), fresh((K * tp, N), dtype)
  specs = (P(None, "tp", None), P("tp", None))
  for fn in both("ag_nn"):
    dx = run(lambda d, w: fn(d, w, axis_name="tp"), tp, (dy, w), specs, P(None, None, "tp"))
    assert_close(dx, np64(dy) @ np64(w).T, dtype, what="ag_nn dx")

    def with_gathered(d, w):
      dx, dy_g = fn(d, w, axis_name="tp", return_gathered=True)
      return dx, dy_g[None]

    dx, dy_g = run(with_gathered, tp, (dy, w), specs, (P(None, None, "tp"), P("tp")))
    assert_close(dx, np64(dy) @ np64(w).T, dtype, what="ag_nn dx (gathered)")
    for r in range(tp):  # every rank holds the whole gathered dY
      np.testing.assert_array_equal(np.asarray(dy_g[r]), np.asarray(dy))


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bulk_ag_nn(tp, dtype):
  x, dy, w = fresh((B, M, K), dtype), fresh((B, M, N * tp), dtype), fresh((K, N * tp), dtype)
  specs = (P(None, "tp", None), P(None, None, "tp"), P(None, "tp"))
  for fn in both("bulk_ag_nn"):
    def f(x, dy, w):
      xg, dxp = fn(x, dy, w, axis_name="tp")
      return xg[None], dxp[None]

    xg, dxp = run(f, tp, (x, dy, w), specs, (P("tp"), P("tp")))
    for r in range(tp):
      np.testing.assert_array_equal(np.asarray(xg[r]), np.asarray(x))
      cols = slice(r * N, (r + 1) * N)
      assert_close(dxp[r], np64(dy)[..., cols] @ np64(w)[:, cols].T, dtype, what=f"dx partial {r}")
    assert_close(np64(dxp).sum(0), np64(dy) @ np64(w).T, dtype, what="sum of partials")


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bulk_rs_nt(tp, dtype):
  dxp, xg, dy = fresh((tp, B, M, K), dtype), fresh((B, M, K), dtype), fresh((B, M, N * tp), dtype)
  specs = (P("tp"), P(), P(None, None, "tp"))
  for fn in both("bulk_rs_nt"):
    f = lambda p, xg, dy: fn(p[0], xg, dy, axis_name="tp")
    dx, dw = run(f, tp, (dxp, xg, dy), specs, (P(None, "tp", None), P(None, "tp")))
    assert_close(dx, np64(dxp).sum(0), dtype, what="bulk_rs_nt dx")
    dense_dw = np.einsum("bmk,bmn->kn", np64(xg), np64(dy))
    assert_close(dw, dense_dw, dtype, what="bulk_rs_nt dw")


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_layouts(layout, dtype):
  a = fresh((B, M, K), dtype)
  b = {"TN": fresh((K, N), dtype), "NN": fresh((N, K), dtype), "NT": fresh((B, M, N), dtype)}[layout]
  dense = {"TN": lambda: np64(a) @ np64(b), "NN": lambda: np64(a) @ np64(b).T,
           "NT": lambda: np.einsum("bmk,bmn->kn", np64(a), np64(b))}[layout]()
  for out in (ops.matmul(a, b, layout=layout), reference.matmul(a, b, layout=layout)):
    assert out.dtype == dtype
    assert_close(out, dense, dtype, what=f"matmul {layout}")


def test_rs_rounds_once_in_fp32():
  """tn_rs sums bf16 partials in fp32 and rounds once: equal to rounding the fp32 sum."""
  tp = 4
  x, w = fresh((M, K * tp), jnp.bfloat16), fresh((K * tp, N), jnp.bfloat16)
  y = run(lambda x, w: ops.tn_rs(x, w, axis_name="tp"), tp, (x, w),
          (P(None, "tp"), P("tp", None)), P("tp", None))
  parts = [np.asarray(jnp.dot(x[:, r * K:(r + 1) * K], w[r * K:(r + 1) * K],
                              preferred_element_type=jnp.float32)) for r in range(tp)]
  expect = jnp.asarray(sum(parts), jnp.float32).astype(jnp.bfloat16)
  np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(expect, np.float32), rtol=1e-2)
