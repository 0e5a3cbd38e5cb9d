"""The fused MoE layer over an EP group of separate GPUs (issue 29; needs 2 or more):
ops.moe_forward under jax.shard_map with impl="fused" against its twin, and jax.grad
of moe_layer (fused in both directions) against the reference layer's, bit for bit
over two runs, on every router kind. One GPU runs none of this (the loopback ranks of
tests/gpu/test_moe_loopback.py cover the device protocol there)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from helpers import assert_close, fresh, put
from kosmos_jax import ops
from kosmos_jax.testing import moe_forward_built
from moe_oracle import NAMES, SPECS, layer_grads, make_params

from test_moe_fused import KINDS, TWIN_RTOL

BF16 = jnp.bfloat16
GPUS = [d for d in jax.devices() if d.platform == "gpu"]

pytestmark = [
    pytest.mark.skipif(not moe_forward_built(), reason="kosmos_moe_forward is not compiled into this extension"),
    pytest.mark.skipif(len(GPUS) < 2, reason=f"EP > 1 across GPUs needs 2 or more GPUs ({len(GPUS)} here)"),
]


def _eps():
  return sorted({2, min(8, len(GPUS))})


def _names(cfg):
  return tuple(n for n in NAMES if n in make_params(cfg, jnp.float32, bool(cfg.shared_expert_intermediate)))


def _mesh(ep):
  return jax.sharding.Mesh(np.array(GPUS[:ep]), ("ep",))


def _forward(cfg, ep, impl, x, p):
  names, m = _names(cfg), _mesh(ep)

  def local(x, *ps):
    y, aux, _ = ops.moe_forward(x, *[dict(zip(names, ps)).get(n) for n in
                                     ("router_w", "gate_up", "down", "shared_gate_up", "shared_down",
                                      "expert_bias")], config=cfg, axis_name="ep", impl=impl)
    return y, aux

  f = jax.jit(jax.shard_map(local, mesh=m, in_specs=(P("ep"), *[SPECS[n] for n in names]),
                            out_specs=(P("ep"), P())))
  return f(put(x, m, P("ep")), *[put(p[n], m, SPECS[n]) for n in names])


@pytest.mark.parametrize("ep", _eps())
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_forward_across_gpus_matches_twin(kind, ep):
  cfg = KINDS[kind]
  if cfg.num_experts % ep:
    pytest.skip(f"num_experts={cfg.num_experts} does not split over ep={ep}")
  p, x = make_params(cfg, BF16, bool(cfg.shared_expert_intermediate)), fresh((512 * ep, cfg.hidden), BF16)
  y, aux = _forward(cfg, ep, "fused", x, p)
  yr, auxr = _forward(cfg, ep, "reference", x, p)
  assert_close(y, yr, BF16, rtol=TWIN_RTOL, what=f"{kind} ep={ep} fused vs twin")
  np.testing.assert_allclose(np.asarray(aux), np.asarray(auxr), rtol=1e-5, atol=0)
  y2, _ = _forward(cfg, ep, "fused", x, p)
  assert np.array_equal(np.asarray(y).view(np.uint16), np.asarray(y2).view(np.uint16)), "two runs differ"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_layer_grad_across_gpus_equals_reference(kind):
  cfg, ep = KINDS[kind], 2
  p = make_params(cfg, BF16, bool(cfg.shared_expert_intermediate))
  x, cot = fresh((512 * ep, cfg.hidden), BF16), fresh((512 * ep, cfg.hidden))
  got, want = (layer_grads(cfg, _mesh(ep), x, p, cot, impl) for impl in ("fused", "reference"))
  again = layer_grads(cfg, _mesh(ep), x, p, cot, "fused")
  for name in got:
    assert_close(got[name], want[name], BF16, what=f"{kind} d{name} fused vs reference")
    assert np.array_equal(np.asarray(got[name], np.float32), np.asarray(again[name], np.float32)), \
        f"{kind} d{name}: two fused runs differ"
