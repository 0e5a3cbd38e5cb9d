"""benchmarks/loopback.py's host-side parts on CPU: the heap it asks for covers
what the handlers check (kosmos_tn_rs staging, kosmos_ag_tn gather slots), its
input tiles have the shape and dtype asked for, and the summary table states the
ratios of the rows it is given. The loopback runs themselves need a GPU
(tests/gpu/test_loopback.py); tests never time."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

_BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(_BENCH))  # its own `import harness`
# Loaded by path under its own name: tests/gpu has a helper module of its own for loopback.
_spec = importlib.util.spec_from_file_location("bench_loopback", _BENCH / "loopback.py")
L = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(L)


def test_heap_covers_the_handlers_need():
  # AG: tp slots of whole 128-row tiles x k bf16; RS: tp chunks x n fp32 staging.
  assert L.heap_mb("ag_tn", 2, 200, 1024, 512) << 20 >= 2 * 256 * 1024 * 2 + (64 << 20)
  assert L.heap_mb("tn_rs", 2, 4096, 6656, 16384) << 20 >= 2 * 4096 * 16384 * 4


def test_tiles_shape_dtype_and_not_constant():
  a = L._tiles(np.random.default_rng(0), (3000, 700))
  assert a.shape == (3000, 700) and a.dtype == L.BF16
  assert np.std(np.asarray(a, np.float32)) > 0.5


def test_table_states_ratios_and_geomeans():
  rows = [dict(kernel="tn_rs", shape=f"s{i}", gemm_full_ms=1.0, gemm_cap_ms=1.5, pull_ms=2.2 * (i + 1),
               pull_vs_gemm=1.1 * (i + 1)) for i in range(2)]
  text = L.table(rows, ["pull"])
  assert "| tn_rs | s1 | 1.000 | 1.500 | 4.400 / 2.200 |" in text
  assert "tn_rs: 2 shapes, arm / (tp x gemm all SMs): pull geomean 1.556, worst 2.200" in text


def test_arm_knobs_follow_the_ops_defaults_and_modifiers():
  from kosmos_jax import kernel_config as config
  kw = L.arm_knobs("pull", "tn_rs", 6656, 16384)
  assert kw == dict(transports=("pull",), knob=config.rs_reducers(6656), stage_bf16=True,
                    band_rows=config.rs_band_rows(16384, 6656))
  kw = L.arm_knobs("push+fp32+bands4+crew8", "tn_rs", 512, 4096)
  assert kw == dict(transports=("push",), knob=8, stage_bf16=False, band_rows=4)
  assert L.arm_knobs("push", "ag_tn", 4096, 768) == dict(transports=("push",), knob=config.ag_movers(768))
  with pytest.raises(ValueError, match="does not apply to ag_tn"):
    L.arm_knobs("pull+fp32", "ag_tn", 4096, 768)
  with pytest.raises(ValueError, match="must start with pull or push"):
    L.arm_knobs("fast", "ag_tn", 4096, 768)
  assert L.arm_knobs("push_fold", "tn_rs", 512, 4096)["transports"] == ("push_fold",)  # by name, as the FFI
  with pytest.raises(ValueError, match="push_fold, tn_rs only"):
    L.arm_knobs("push_fold", "ag_tn", 4096, 768)


def test_loopback_without_a_gpu_says_why():
  import jax
  if any(d.platform == "gpu" for d in jax.devices()):
    pytest.skip("a GPU is visible: tests/gpu/test_loopback.py runs the hook")
  from kosmos_jax.testing import loopback
  inputs = [[[np.zeros((128, 64), L.BF16), np.zeros((64, 64), L.BF16)]] * 2]
  with pytest.raises(NotImplementedError, match="GPU|CUDA"):
    loopback.run(["ag_tn"], 2, 128, 64, 64, inputs, cu_cap=4, calls=1)


@pytest.mark.parametrize("transports", [(0,), (1, 0), "push"])
def test_loopback_takes_transport_names_only(transports):
  # Refused before any GPU is looked for: the integer codes are gone, and a bare
  # string is not a sequence of names.
  from kosmos_jax.testing import loopback
  inputs = [[[np.zeros((128, 64), L.BF16), np.zeros((64, 64), L.BF16)]] * 2]
  with pytest.raises(ValueError, match=r"transports=.* must be a sequence of transport names \('pull', 'push', "
                                       r"'push_fold'\)"):
    loopback.run(["ag_tn"], 2, 128, 64, 64, inputs, cu_cap=4, calls=1, transports=transports)
