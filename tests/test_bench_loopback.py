"""benchmarks/loopback.py's host-side parts on CPU: the heap it asks for covers
what the handlers check (kosmos_tn_rs staging, kosmos_ag_tn gather slots), its
input tiles have the shape and dtype asked for, and the summary table states the
ratios of the rows it is given. The loopback runs themselves need a GPU
(tests/gpu/test_loopback.py); tests never time."""
from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import loopback as L  # noqa: E402


def test_heap_covers_the_handlers_need():
  # AG: tp slots of whole 128-row tiles x k bf16; RS: tp chunks x n fp32 staging.
  assert L.heap_mb("ag_tn", 2, 200, 1024, 512) << 20 >= 2 * 256 * 1024 * 2 + (64 << 20)
  assert L.heap_mb("tn_rs", 2, 4096, 6656, 16384) << 20 >= 2 * 4096 * 16384 * 4


def test_tiles_shape_dtype_and_not_constant():
  a = L._tiles(np.random.default_rng(0), (3000, 700))
  assert a.shape == (3000, 700) and a.dtype == L.BF16
  assert np.std(np.asarray(a, np.float32)) > 0.5


def test_table_states_ratios_and_geomeans():
  rows = [dict(kernel="tn_rs", shape=f"s{i}", gemm_full_ms=1.0, gemm_cap_ms=2.0, pull_ms=2.2 * (i + 1),
               push_ms=2.0 * (i + 1), pull_vs_gemm_cap=1.1 * (i + 1), push_vs_gemm_cap=1.0 * (i + 1),
               push_vs_pull=2.0 / 2.2) for i in range(2)]
  text = L.table(rows)
  assert "| tn_rs | s1 | 1.000 | 2.000 | 4.400 | 4.000 | 2.200 | 2.000 | 0.909 |" in text
  assert "tn_rs: 2 shapes; geomean pull / gemm cap 1.556" in text and "worst pull / gemm cap 2.200" in text
