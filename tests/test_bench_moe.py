"""benchmarks/moe.py --dry-run on CPU: every preset x routing has its rows, the reference
arm a time, the routing its intended loads (balanced exactly), the arms that need the
CUDA build are recorded as unavailable (never silently run as the reference), and the
CSV, PNG and table are written, RESULTS.md untouched. A subprocess, so the benchmark
sets up JAX itself; tests never time, so no number is checked."""
from __future__ import annotations

import csv
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PRESETS = ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "llama4-scout", "llama4-maverick")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("moe")
  results = (ROOT / "benchmarks" / "RESULTS.md").read_bytes()
  env = dict(os.environ, JAX_PLATFORMS="cpu", OUT=str(tmp / "out"))
  (tmp / "out").mkdir()
  proc = subprocess.run([sys.executable, "benchmarks/moe.py", "--dry-run", "--tokens", "128",
                         "--arms", "reference,fused,fused_fixed,floor", "--out-dir", str(tmp / "bench")],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert (ROOT / "benchmarks" / "RESULTS.md").read_bytes() == results, "--dry-run must not append to RESULTS.md"
  with (tmp / "bench" / "moe.csv").open() as f:
    return tmp, proc.stdout, list(csv.DictReader(f))


def test_rows_per_preset_routing_and_arm(dry_run):
  _, _, rows = dry_run
  keys = {(r["preset"], r["routing"], r["arm"]) for r in rows}
  assert keys == {(p, rt, a) for p in PRESETS for rt in ("balanced", "skewed")
                  for a in ("reference", "fused", "fused_fixed", "floor")}
  for r in rows:
    if r["arm"] == "reference":
      assert r["status"] == "ok" and float(r["median_ms"]) > 0 and float(r["tflops"]) > 0, r
    else:  # no GPU here: recorded with the reason, not replaced by the twin
      assert r["status"] == "unavailable" and r["reason"] and r["median_ms"] == "", r


def test_routing_loads(dry_run):
  _, _, rows = dry_run
  for r in rows:
    if r["routing"] == "balanced":
      assert float(r["max_load"]) == 1.0, r
    else:
      assert float(r["max_load"]) > 1.4, r
    assert int(r["tokens"]) == 128 and int(r["experts"]) <= 16


def test_outputs_and_table(dry_run):
  tmp, stdout, _ = dry_run
  for name in ("moe.csv", "moe.md", "moe.png"):
    assert (tmp / "bench" / name).stat().st_size > 0
    assert (tmp / "out" / name).exists(), f"{name} not copied into $OUT"
  table = [line for line in stdout.splitlines() if line.startswith("| ")]
  assert table[0].startswith("| preset | E | routing | max load | reference ms / TF/s | fused ms / TF/s")
  assert len(table) == 2 + 2 * len(PRESETS)
  assert "| deepseek-v3 | 16 of 256 | balanced | 1.00 |" in stdout


def test_moe_train_step_toy_runs(tmp_path):
  """benchmarks/moe_train_step.py --toy on CPU (the MoE proxy model's training step,
  reference arm): it builds the blocks, takes the gradients and writes its row; --oracle
  compares them with the fp32 step's (bf16 is near it, not equal)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "benchmarks/moe_train_step.py", "--toy", "--preset", "llama4-scout",
                         "--oracle", "--out-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with (tmp_path / "moe_train_step_llama4-scout.csv").open() as f:
    (row,) = list(csv.DictReader(f))
  assert row["layers"] == "2" and float(row["reference_ms"]) > 0 and "fused_ms" not in row
  assert 0 < float(row["reference_vs_oracle"]) < 0.5, row["reference_vs_oracle"]
  assert "(reference against the fp32 oracle)" in proc.stdout


def test_timeline_splits_launches():
  """benchmarks/moe.py --timeline-step's summary: the records of a step split into its two
  launches (each launch's spans overlap; XLA's gap between them), the backward's build spans
  named by GEMM kind."""
  import importlib.util

  import numpy as np

  from kosmos_jax import trace
  spec = importlib.util.spec_from_file_location("moe_bench", ROOT / "benchmarks" / "moe.py")
  sys.path.insert(0, str(ROOT / "benchmarks"))
  try:
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
  finally:
    sys.path.remove(str(ROOT / "benchmarks"))
  # (start, end, tile, cta, role): a forward 0-100 (two CTAs, a gap 60-70 where no span is
  # open), XLA 100-150, a backward 150-400.
  spans = [(0, 60, 1, 0, 0), (70, 100, 2, 1, 0), (10, 20, 0, 1, 1), (150, 300, 1, 0, 0), (160, 400, 4, 1, 0),
           (170, 390, 3, 2, 0), (155, 158, (6 << 20) | 3, 2, 3)]
  recs = np.array([(s, e, t, c, 0, r) for s, e, t, c, r in spans], trace.RECORD_DTYPE)
  launches = bench._launches(recs[::-1], 2)
  assert [x.size for x in launches] == [3, 4]
  lines = bench._launch_lines(launches[1], "backward", 0)
  assert lines[0] == " backward launch: 0.2 us, from 0.1 us"
  text = "\n".join(lines)
  for kind in ("dgrad2", "wgrad2", "wgrad1"):
    assert f"  {kind}" in text
  assert "dgrad1" not in text and "wait gemm1" in text


def test_ep2_dry_run(tmp_path):
  """--ep 2: the layer over a two-device EP group, 128 tokens per device, the fused arms
  recorded as unavailable on CPU, the floor as one device's share."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
  proc = subprocess.run([sys.executable, "benchmarks/moe.py", "--dry-run", "--tokens", "128", "--ep", "2",
                         "--presets", "qwen3-30b-a3b", "--routing", "balanced", "--arms", "reference,fused",
                         "--out-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with (tmp_path / "moe.csv").open() as f:
    rows = {r["arm"]: r for r in csv.DictReader(f)}
  assert rows["reference"]["status"] == "ok" and rows["reference"]["ep"] == "2", rows
  assert rows["fused"]["status"] == "unavailable", rows
  bad = subprocess.run([sys.executable, "benchmarks/moe.py", "--dry-run", "--ep", "3"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
  assert bad.returncode != 0 and "--ep 3: 2 devices here" in bad.stderr, bad.stderr[-2000:]
