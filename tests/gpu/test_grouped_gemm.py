"""kosmos_grouped_gemm, the MoE benchmark's floor (kosmos_jax.testing.grouped_gemm), on one
GPU against the same product in XLA: balanced rows as the benchmark gives them, and
ragged ones with an empty expert; outputs poisoned before the launch (conftest)."""
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
