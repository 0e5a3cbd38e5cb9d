"""The transport reaches the fused kernels by name: ag_tn and tn_rs lower (on CPU,
through kosmos_jax.testing.fused_on_cpu) to a `kosmos_<op>` custom call whose
`transport` attribute is the config's string, which csrc/fused_run.h parses;
no integer code (the old `push` attribute) is emitted, and the ops with a single
transport carry none."""
import jax.numpy as jnp
import pytest

from kosmos_jax import AgConfig, RsConfig, ops
from kosmos_jax.testing import fused_on_cpu
from helpers import P, fresh, mesh, shard_map

TP = 2


@pytest.fixture(autouse=True)
def no_gpu_needed():
  with fused_on_cpu():
    yield


def _call_line(fn, in_specs, out_specs, args, target):
  text = shard_map(fn, mesh(TP), in_specs, out_specs).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  calls = [line for line in text.splitlines() if f"custom_call @{target}" in line]
  assert len(calls) == 1, text[-3000:]
  return calls[0]


@pytest.mark.parametrize("transport", ["pull", "push"])
def test_ag_tn_carries_its_transport_by_name(transport):
  x, w = fresh((1, 256 * TP, 64), jnp.bfloat16), fresh((64, 128 * TP), jnp.bfloat16)
  call = _call_line(lambda x, w: ops.ag_tn(x, w, axis_name="tp", impl="fused", config=AgConfig(transport=transport)),
                    (P(None, "tp", None), P(None, "tp")), P(None, None, "tp"), (x, w), "kosmos_ag_tn")
  assert f'transport = "{transport}"' in call, call
  assert "push =" not in call, call


@pytest.mark.parametrize("transport", ["pull", "push", "push_fold"])
def test_tn_rs_carries_its_transport_by_name(transport):
  x, w = fresh((1, 256 * TP, 64 * TP), jnp.bfloat16), fresh((64 * TP, 128), jnp.bfloat16)
  cfg = RsConfig(transport=transport)
  call = _call_line(lambda x, w: ops.tn_rs(x, w, axis_name="tp", impl="fused", config=cfg),
                    (P(None, None, "tp"), P("tp", None)), P(None, "tp", None), (x, w), "kosmos_tn_rs")
  assert f'transport = "{transport}"' in call, call
  assert "push =" not in call, call
  if transport == "push_fold":  # every CTA builds: the fold has no reduce queue
    assert "reducers = 0 : i64" in call, call


def test_single_transport_ops_carry_none():
  dy, w = fresh((1, 256 * TP, 128), jnp.bfloat16), fresh((64 * TP, 128), jnp.bfloat16)
  call = _call_line(lambda dy, w: ops.ag_nn(dy, w, axis_name="tp", impl="fused"),
                    (P(None, "tp", None), P("tp", None)), P(None, None, "tp"), (dy, w), "kosmos_ag_nn")
  assert "transport" not in call and "push" not in call, call
