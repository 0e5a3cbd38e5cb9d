"""The MoE benchmark's floor (kosmos_jax.testing.grouped_gemm: the forward's grouped GEMM,
the backward's dgrad, dgrad2 with the SwiGLU backward, and wgrad), on one GPU against the
same products in XLA: balanced rows as the benchmark gives them, and ragged ones with an
empty expert; widths that are not whole 256-column tiles (an expert's B rows then run
into the next one's, and dgrad2's gate tile into the up columns, unless clipped); outputs
poisoned before the launch (conftest)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_close, fresh
from kosmos_jax.testing import grouped_gemm as gg

pytestmark = pytest.mark.skipif(not gg.status()[0], reason=f"grouped GEMM unavailable: {gg.status()[1]}")
BF16 = jnp.bfloat16


@pytest.mark.parametrize("tiles", [None, (0, 0, 2, 3, 3, 3, 5)], ids=["balanced", "ragged"])
def test_matches_xla(tiles):
  e, k, n = 6, 256, 384
  te = gg.balanced_tiles(200, e)[1] if tiles is None else np.asarray(tiles, np.int32)
  a = fresh((len(te) * gg.TILE_ROWS, k), BF16)
  b = fresh((e, k, n), BF16, k ** -0.5)
  c = jax.jit(gg.grouped_gemm)(a, b, jnp.asarray(te))
  assert_close(c, gg.grouped_gemm_xla(a, b, jnp.asarray(te)), BF16, what=f"grouped GEMM {tiles or 'balanced'}")


def test_refuses_a_bad_shape():
  with pytest.raises(ValueError, match=r"M a multiple of 128"):
    gg.grouped_gemm(jnp.zeros((100, 64), BF16), jnp.zeros((2, 64, 64), BF16), jnp.zeros((1,), jnp.int32))


RAGGED = (0, 0, 2, 3, 3, 3, 5)  # experts 1 and 4 have no rows


def _rows(e, tiles, width, zero_pad=200):
  """Rows [M, width] expert-major; balanced: every expert `zero_pad` rows, the rest of its
  128-row tiles zero (padding), as the megakernel's arena has them."""
  te = gg.balanced_tiles(zero_pad, e)[1] if tiles is None else np.asarray(tiles, np.int32)
  a = fresh((len(te) * gg.TILE_ROWS, width), BF16)
  if tiles is None:
    per = len(te) // e * gg.TILE_ROWS
    keep = (np.arange(len(te) * gg.TILE_ROWS) % per < zero_pad)[:, None]
    a = jnp.where(keep, a, 0).astype(BF16)
  return te, a


@pytest.mark.parametrize("tiles", [None, RAGGED], ids=["balanced", "ragged"])
def test_dgrad_matches_xla(tiles):
  e, k, n = 6, 320, 384
  te, a = _rows(e, tiles, k)
  b = fresh((e, n, k), BF16, k ** -0.5)
  c = jax.jit(gg.grouped_dgrad)(a, b, jnp.asarray(te))
  assert_close(c, gg.grouped_dgrad_xla(a, b, jnp.asarray(te)), BF16, what=f"grouped dgrad {tiles or 'balanced'}")


@pytest.mark.parametrize("tiles", [None, RAGGED], ids=["balanced", "ragged"])
def test_swiglu_bwd_matches_xla(tiles):
  e, h, i = 6, 256, 384
  te, dy = _rows(e, tiles, h)
  w2 = fresh((e, i, h), BF16, h ** -0.5)
  h1 = fresh((dy.shape[0], 2 * i), BF16, 2.0)
  dh1 = jax.jit(gg.grouped_swiglu_bwd)(dy, w2, h1, jnp.asarray(te))
  want = gg.grouped_swiglu_bwd_xla(dy, w2, h1, jnp.asarray(te))
  assert_close(dh1[:, :i], want[:, :i], BF16, what=f"dgrad2 d(gate) {tiles or 'balanced'}")
  assert_close(dh1[:, i:], want[:, i:], BF16, what=f"dgrad2 d(up) {tiles or 'balanced'}")


@pytest.mark.parametrize("tiles", [None, RAGGED], ids=["balanced", "ragged"])
@pytest.mark.parametrize("p,q", [(256, 384), (384, 72)])
def test_wgrad_matches_xla(tiles, p, q):
  e = 6
  te, a = _rows(e, tiles, p)
  b = fresh((a.shape[0], q), BF16)
  rb = gg.expert_row_blocks(te, e)
  c = jax.jit(gg.grouped_wgrad)(a, b, jnp.asarray(rb))
  want = gg.grouped_wgrad_xla(a, b, rb)
  assert_close(c, want, BF16, what=f"grouped wgrad {tiles or 'balanced'} P={p} Q={q}")
  for x in np.flatnonzero(rb[1:] == rb[:-1]):  # an expert without rows: exactly zeros (the output was poisoned)
    assert not np.any(np.asarray(c[x], np.float32)), f"expert {x} has no rows but a nonzero dW"


def test_wgrad_is_reproducible():
  te, a = _rows(4, None, 256, zero_pad=1000)
  b = fresh((a.shape[0], 512), BF16)
  rb = jnp.asarray(gg.expert_row_blocks(te, 4))
  run = jax.jit(gg.grouped_wgrad)
  first = np.asarray(run(a, b, rb))
  for _ in range(3):
    assert np.array_equal(np.asarray(run(a, b, rb)), first), "wgrad differs between two runs"
