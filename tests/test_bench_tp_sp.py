"""benchmarks/tp_sp.py --smoke on CPU virtual devices: the CSV has its columns, every
arm has a time or a reason, and the arms that need the CUDA build are recorded as
unavailable (never silently run as the reference). Runs as a subprocess so the
benchmark gets its own device count; tests never time, so no number is checked."""
from __future__ import annotations

import csv
import os
import pathlib
import subprocess
import sys

import pytest

from kosmos_jax import ops

ROOT = pathlib.Path(__file__).resolve().parents[1]
COLUMNS = ["kernel", "shape", "tp", "M", "N", "K", "arm", "variant", "status", "reason", "median_ms", "min_ms",
           "calls", "reps", "tflops", "speedup_vs_xla", "frac_of_floor", "rel_err_vs_xla"]
ARMS = {"xla", "comm_alone", "gemm_alone_kosmos", "gemm_alone_xla", "pallas_mgpu", "kosmos_unfused",
        "kosmos_fused", "kosmos_push", "kosmos_fold", "fixed_split_56", "fixed_split_best"}
NEEDS_OP = {"gemm_alone_kosmos": "matmul", "kosmos_unfused": "matmul", "kosmos_fused": None, "kosmos_push": None,
           "kosmos_fold": None,
            "fixed_split_56": None, "fixed_split_best": None}  # None: the row's own kernel


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("tp_sp")
  results = (ROOT / "benchmarks" / "RESULTS.md").read_bytes()
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
             OUT=str(tmp / "out"))
  proc = subprocess.run([sys.executable, "benchmarks/tp_sp.py", "--smoke", "--out-dir", str(tmp / "bench")],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert (ROOT / "benchmarks" / "RESULTS.md").read_bytes() == results, "--smoke must not append to RESULTS.md"
  with (tmp / "bench" / "tp_sp.csv").open() as f:
    reader = csv.DictReader(f)
    return tmp, reader.fieldnames, list(reader)


def test_csv_columns_and_coverage(smoke):
  _, fields, rows = smoke
  assert fields == COLUMNS
  assert {r["kernel"] for r in rows} == {"ag_tn", "tn_rs"}
  for k in ("ag_tn", "tn_rs"):
    shapes = {r["shape"] for r in rows if r["kernel"] == k}
    assert len(shapes) == 2
    for s in shapes:  # one row per shape x arm
      assert sorted(r["arm"] for r in rows if r["kernel"] == k and r["shape"] == s) == sorted(ARMS)
  assert {r["tp"] for r in rows} == {"4"}


def test_every_arm_has_time_or_reason(smoke):
  _, _, rows = smoke
  for r in rows:
    what = f"{r['kernel']} {r['shape']} {r['arm']}"
    if r["status"] == "ok":
      assert float(r["median_ms"]) > 0 and float(r["tflops"]) > 0, what
      assert r["speedup_vs_xla"] and r["frac_of_floor"], what
    else:
      assert r["status"] in ("unavailable", "failed", "not_run") and r["reason"].strip(), what
      assert r["median_ms"] == "", what
  assert all(r["status"] == "ok" for r in rows if r["arm"] in ("xla", "comm_alone", "gemm_alone_xla"))


def test_fused_arms_unavailable_on_cpu(smoke):
  _, _, rows = smoke
  for r in rows:
    if r["arm"] == "kosmos_fold" and r["kernel"] == "ag_tn":  # a GEMM+RS transport only
      assert r["status"] == "unavailable" and "not applicable" in r["reason"], r
      continue
    if r["arm"] in NEEDS_OP:
      op = NEEDS_OP[r["arm"]] or r["kernel"]
      ok, why = ops.fused_status(op)
      if ok:
        pytest.skip("the fused kernels are usable here; this test is for CPU-only machines")
      assert r["status"] == "unavailable", (r["arm"], r["status"], r["reason"])
      assert why in r["reason"], (r["arm"], r["reason"])
    if r["arm"] == "pallas_mgpu":
      assert r["status"] == "unavailable"
      assert ("not applicable" if r["kernel"] == "tn_rs" else "CUDA GPU") in r["reason"]


def test_outputs_written(smoke):
  tmp, _, _ = smoke
  summary = (tmp / "out" / "tp_sp_summary.md").read_text()
  assert "### ag_tn" in summary and "### tn_rs" in summary and "Not measured:" in summary
  for name in ("tp_sp.csv", "tp_sp_ag_tn.png", "tp_sp_tn_rs.png"):
    assert (tmp / "out" / name).stat().st_size > 0
    assert (tmp / "bench" / name).stat().st_size > 0


def test_fused_knobs_are_parsed_and_checked():
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import tp_sp
  assert tp_sp.parse_args(["--fused-knobs", "band_rows=8,reducers=16"]).fused_knobs == {"band_rows": 8, "reducers": 16}
  assert tp_sp.parse_args([]).fused_knobs == {}
  assert tp_sp.parse_args(["--fused-knobs", "transport=push"]).fused_knobs == {"transport": "push"}
  for bad in ("band_rows=8.5", "=3", "band_rows="):
    with pytest.raises(SystemExit):
      tp_sp.parse_args(["--fused-knobs", bad])


def _smoke_rows(tmp_path, devices: int, *args) -> list[dict]:
  """benchmarks/tp_sp.py --smoke on `devices` CPU devices with `args`: its CSV rows."""
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
  env.pop("OUT", None)
  proc = subprocess.run([sys.executable, "benchmarks/tp_sp.py", "--smoke", *args, "--out-dir", str(tmp_path)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with (tmp_path / "tp_sp.csv").open() as f:
    return list(csv.DictReader(f))


def test_block_protocol_smoke(tmp_path):
  """--protocol blocks (one timing block per arm, the protocol before 2026-12-01) still runs."""
  rows = _smoke_rows(tmp_path, 2, "--protocol", "blocks", "--kernels", "ag_tn", "--arms", "xla,gemm_alone")
  assert {r["arm"] for r in rows if r["status"] == "ok"} >= {"xla", "gemm_alone_xla"}, rows


def test_smoke_at_tp8(tmp_path):
  """The benchmark at TP = 8 (issue 7's run) on 8 CPU virtual devices: every row has tp 8 and
  the XLA arms ran."""
  rows = _smoke_rows(tmp_path, 8, "--arms", "xla,comm_alone,gemm_alone")
  assert rows and {r["tp"] for r in rows} == {"8"}
  assert {(r["kernel"], r["arm"]) for r in rows if r["status"] == "ok"} >= {
      (k, a) for k in ("ag_tn", "tn_rs") for a in ("xla", "comm_alone", "gemm_alone_xla")}, rows


def test_time_candidates_records_failures():
  """A variant that raises while timed gets an "error" and no timing: under blocks only it
  fails, interleaved it fails every variant timed with it (one shared run)."""
  import types
  import jax.numpy as jnp
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import tp_sp

  def boom(x):
    raise RuntimeError("out of memory")

  def cands():
    sets = [(jnp.zeros(2),)]
    return [dict(variant="ok", fn=lambda x: x, sets=sets, calls=2, timing=None, note=""),
            dict(variant="bad", fn=boom, sets=sets, calls=2, timing=None, note="")]
  args = types.SimpleNamespace(protocol="blocks", reps=2, warmup_s=0.0)
  cs = cands()
  tp_sp.time_candidates(cs, args)
  assert cs[0]["timing"] is not None and "error" not in cs[0]
  assert cs[1]["timing"] is None and "out of memory" in cs[1]["error"]
  cs = cands()
  tp_sp.time_candidates(cs, types.SimpleNamespace(protocol="interleaved", reps=2, warmup_s=0.0))
  assert all(c["timing"] is None and "interleaved timing" in c["error"] for c in cs)


def test_acceptance_lines_apply_issue_6_bars():
  """The verdict per fused arm: geomean bar, no shape slower than XLA, within 1.15x of our
  GEMM alone, and (AG) 1.15x Pallas; a shape the arm did not measure makes it INCOMPLETE."""
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import tp_sp

  def row(shape, arm, ms, status="ok"):
    return dict(kernel="ag_tn", shape=shape, arm=arm, status=status, median_ms=ms)
  rows = [row("a", "xla", 3.0), row("a", "gemm_alone_kosmos", 1.9), row("a", "kosmos_fused", 2.0),
          row("a", "pallas_mgpu", 2.4), row("a", "kosmos_push", 1.5),
          row("b", "xla", 2.0), row("b", "gemm_alone_kosmos", 1.0), row("b", "kosmos_fused", 1.1),
          row("b", "pallas_mgpu", 1.4), row("b", "kosmos_push", 0.0, status="failed")]
  fused, push = tp_sp._acceptance_lines(rows, "ag_tn")
  assert "kosmos_fused (2 / 2 shapes)" in fused and fused.endswith("-> PASS"), fused   # 1.5x, 1.82x; <= 1.1x GEMM
  assert "kosmos_push (1 / 2 shapes)" in push and push.endswith("-> INCOMPLETE"), push
  rows[2]["median_ms"] = 3.1  # slower than XLA on shape a, 1.63x its GEMM alone
  (fused, _) = tp_sp._acceptance_lines(rows, "ag_tn")
  assert "slowest shape 0.968 x XLA (need >= 1): no" in fused and fused.endswith("-> FAIL"), fused
  assert tp_sp._acceptance_lines([r for r in rows if r["arm"] == "xla"], "ag_tn") == []


def test_ceiling_line_bounds_the_bars():
  """The ceiling hides every collective behind our GEMM: xla / max(GEMM, collective) per
  shape, and how many shapes could be within 1.15x of the GEMM at all."""
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import tp_sp

  def row(shape, arm, ms):
    return dict(kernel="tn_rs", shape=shape, arm=arm, status="ok", median_ms=ms)
  rows = [row("a", "xla", 3.0), row("a", "gemm_alone_kosmos", 2.0), row("a", "comm_alone", 1.0),
          row("b", "xla", 2.0), row("b", "gemm_alone_kosmos", 0.5), row("b", "comm_alone", 1.0)]
  (line,) = tp_sp._ceiling_line(rows, "tn_rs")
  # a: 3 / 2 = 1.5; b: 2 / 1 = 2 (link-bound: 2x its GEMM, never within 1.15x)
  assert "geomean 1.732 x XLA (bar 1.55)" in line and "1 / 2 shapes" in line, line
  assert tp_sp._ceiling_line([r for r in rows if r["arm"] != "comm_alone"], "tn_rs") == []


def test_backward_kernels_smoke(tmp_path):
  """--kernels ag_nn,bulk_ag_nn,bulk_rs_nt (issue 29's backward-vs-XLA run) on 4 CPU
  devices: one row per shape and arm, XLA's arms timed, the fused arms unavailable with
  the op's reason (or not applicable: one transport each)."""
  rows = _smoke_rows(tmp_path, 4, "--kernels", "ag_nn,bulk_ag_nn,bulk_rs_nt")
  assert {r["kernel"] for r in rows} == {"ag_nn", "bulk_ag_nn", "bulk_rs_nt"}
  for k in ("ag_nn", "bulk_ag_nn", "bulk_rs_nt"):
    for s in {r["shape"] for r in rows if r["kernel"] == k}:
      assert sorted(r["arm"] for r in rows if r["kernel"] == k and r["shape"] == s) == sorted(ARMS)
  for r in rows:
    if r["arm"] in ("xla", "comm_alone", "gemm_alone_xla"):
      assert r["status"] == "ok" and float(r["median_ms"]) > 0, r
    elif r["arm"] in ("kosmos_push", "kosmos_fold", "pallas_mgpu"):
      assert r["status"] == "unavailable" and "not applicable" in r["reason"], r
    elif not ops.fused_status(NEEDS_OP[r["arm"]] or r["kernel"])[0]:
      assert r["status"] == "unavailable" and r["reason"], r


@pytest.mark.parametrize("kernel", ["ag_nn", "bulk_ag_nn", "bulk_rs_nt"])
def test_backward_xla_arm_computes_the_op(kernel):
  """The xla arm of a backward kernel computes what the op computes (its reference twin,
  under the same shard_map), on a smoke shape at tp 2: the baseline times the same math."""
  import jax
  import numpy as np
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import tp_sp_arms as A
  devs = jax.devices()[:2]
  if len(devs) < 2:
    pytest.skip("needs 2 CPU devices (tests/conftest.py sets them)")
  mesh = jax.sharding.Mesh(np.array(devs), (A.AXIS,))
  import jax.numpy as jnp
  pb = A.problem(kernel, A.SMOKE[kernel][0], 2, mesh, jnp.float32, smoke=True)
  inputs = A.make_inputs(pb, 0)
  (xla_fn, _), = A.arm_xla(pb).values()
  kw = dict(return_gathered=True) if kernel == "ag_nn" else {}
  ref = A._smap(pb, lambda *a: getattr(ops, kernel)(*a, axis_name=A.AXIS, impl="reference", **kw))
  got, want = xla_fn(*inputs), ref(*inputs)
  assert len(got) == len(want) == 2
  for g, w in zip(got, want):
    assert g.shape == w.shape
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
