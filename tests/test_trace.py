"""Role timelines (kosmos_jax/trace.py, kernels/include/kosmos/trace.h): the C++
record layout as Python reads it, the Chrome-trace JSON, and the PNG timeline."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from host_build import CXX, ROOT, build
from kosmos_jax import trace


def _synthetic(rng, ranks=2, ctas=3, spans=5, base=1_700_000_000_000_000_000):
  """Back-to-back spans per (rank, CTA) with random roles and lengths, shuffled."""
  rows = []
  for r in range(ranks):
    for c in range(ctas):
      t = base + int(rng.integers(0, 5000))
      for i in range(spans):
        d = int(rng.integers(1, 3000))
        rows.append((t, t + d, i if i % 2 else -1, c, r, int(rng.integers(0, len(trace.ROLE_NAMES)))))
        t += d
  recs = np.array(rows, dtype=trace.RECORD_DTYPE)
  return recs[rng.permutation(recs.size)]


def test_record_dtype_matches_the_header_fields():
  assert trace.RECORD_DTYPE.itemsize == 24
  offs = {n: trace.RECORD_DTYPE.fields[n][1] for n in trace.RECORD_DTYPE.names}
  assert offs == {"start_ns": 0, "end_ns": 8, "tile": 16, "cta": 20, "rank": 22, "role": 23}


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++/c++/clang++) found")
@pytest.mark.parametrize("traced", [True, False])
def test_cpp_records_read_back(tmp_path, traced):
  out = str(tmp_path / "trace.bin")
  exe = build(tmp_path, "trace_dump.cc", *(["-DKOSMOS_TRACE"] if traced else []), name="dump")
  subprocess.run([exe, out], check=True)
  raw = np.fromfile(out, np.uint8)
  counts = raw[:8].view("<u4")
  recs, dropped = trace.records_from_buffer(raw[8:], counts, cap=3)
  if not traced:
    assert counts.tolist() == [0, 0] and recs.size == 0 and dropped == 0
    return
  assert counts.tolist() == [4, 2] and dropped == 1
  assert recs["cta"].tolist() == [0, 0, 0, 1, 1]
  assert recs["rank"].tolist() == [5] * 5
  assert recs["start_ns"].tolist() == [1000, 1100, 1200, 1010, 1500]
  assert recs["end_ns"].tolist() == [1050, 1150, 1250, 1500, 1510]
  assert recs["tile"].tolist() == [10, 11, 12, 7, -1]
  assert recs["role"].tolist() == [0, 1, 2, 2, 3]


def test_chrome_trace_schema_and_order():
  rng = np.random.default_rng(0)
  recs = _synthetic(rng)
  obj = json.loads(json.dumps(trace.to_chrome_trace(recs)))  # must be plain JSON
  assert obj["displayTimeUnit"] == "ns"
  evs = obj["traceEvents"]
  meta = [e for e in evs if e["ph"] == "M"]
  spans = [e for e in evs if e["ph"] == "X"]
  assert len(spans) == recs.size
  names = {(e["pid"], e["tid"], e["name"]): e["args"] for e in meta}
  for r in range(2):
    assert names[(r, 0, "process_name")] == {"name": f"rank {r}"}
    for c in range(3):
      assert names[(r, c, "thread_name")] == {"name": f"CTA {c}"}
  for e in spans:
    assert set(e) == {"name", "cat", "ph", "pid", "tid", "ts", "dur", "args"}
    assert e["name"] == trace.ROLE_NAMES[e["args"]["role"]]
    assert e["dur"] > 0 and e["ts"] >= 0
  keys = [(e["pid"], e["tid"], e["ts"]) for e in spans]
  assert keys == sorted(keys)
  # Times are relative to the earliest start, in microseconds, exact to the ns.
  t0 = int(recs["start_ns"].min())
  first = recs[np.lexsort((recs["start_ns"], recs["cta"], recs["rank"]))][0]
  assert spans[0]["ts"] == (int(first["start_ns"]) - t0) / 1000.0
  assert spans[0]["dur"] == (int(first["end_ns"]) - int(first["start_ns"])) / 1000.0
  assert min(e["ts"] for e in spans) == 0.0
  tiles = sorted(e["args"]["tile"] for e in spans if "tile" in e["args"])
  assert tiles == sorted(int(t) for t in recs["tile"] if t >= 0)


def test_chrome_trace_per_rank_origin(tmp_path):
  rng = np.random.default_rng(1)
  recs = _synthetic(rng, ranks=3)
  recs["start_ns"][recs["rank"] == 2] += 10_000_000  # rank 2's clock runs 10 ms ahead
  recs["end_ns"][recs["rank"] == 2] += 10_000_000
  path = trace.write_chrome_trace(recs, tmp_path / "t.json", per_rank_origin=True)
  spans = [e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X"]
  for r in range(3):
    assert min(e["ts"] for e in spans if e["pid"] == r) == 0.0
    assert max(e["ts"] for e in spans if e["pid"] == r) < 100.0


def test_bad_records_are_refused():
  rng = np.random.default_rng(2)
  recs = _synthetic(rng)
  recs["end_ns"][3] = recs["start_ns"][3] - 1
  with pytest.raises(ValueError, match="end before they start"):
    trace.to_chrome_trace(recs)
  with pytest.raises(ValueError, match="whole number"):
    trace.as_records(np.zeros(25, np.uint8))
  with pytest.raises(ValueError, match="expected"):
    trace.as_records(np.zeros(2, dtype=[("a", "<u8")]))
  with pytest.raises(ValueError, match="CTAs x cap"):
    trace.records_from_buffer(np.zeros(4, trace.RECORD_DTYPE), [1, 1, 1], cap=2)


def test_import_does_not_load_matplotlib():
  code = "import sys, kosmos_jax.trace; assert 'matplotlib' not in sys.modules"
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
  assert r.returncode == 0, r.stderr[-2000:]


def test_png_timeline(tmp_path):
  pytest.importorskip("matplotlib")
  rng = np.random.default_rng(3)
  recs = _synthetic(rng, ranks=2, ctas=4)
  path = trace.plot_timeline(recs, tmp_path / "timeline.png", title="synthetic")
  with open(path, "rb") as f:
    head = f.read(8)
  assert head == b"\x89PNG\r\n\x1a\n"
  assert os.path.getsize(path) > 2000


def test_capture_needs_a_traced_build():
  """capture() refuses clearly when the kernels cannot record (no CUDA build, or a
  build without KOSMOS_TRACE): it never returns an empty timeline as if it ran."""
  from kosmos_jax import trace
  with pytest.raises(NotImplementedError, match="KOSMOS_TRACE|CUDA"):
    trace.capture(lambda: 1)


def test_tile_phase_summary_of_gemm_rs_spans():
  """scripts/gpu_timelines.py's per-tile summary (the spans of gemm_rs_sm90.cuh tile_phase):
  a tile's phases chain end to start; a band wait inside a combine is counted apart."""
  import importlib.util
  import pathlib
  path = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "gpu_timelines.py"
  spec = importlib.util.spec_from_file_location("gpu_timelines", path)
  gt = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(gt)
  rows, t = [], 1000
  for cta in range(2):
    for k in range(4):
      tile, own = (k << 12) | cta, k % 2 == 0
      rows.append((t, t + 5000, tile, cta, 0, 0)); t += 5000     # mainloop
      rows.append((t, t + 500, tile, cta, 0, 3)); t += 500       # retire + stage
      if own:
        rows.append((t + 10, t + 110, k, cta, 0, 3))             # band wait, inside the combine
        rows.append((t, t + 2000, tile, cta, 0, 2)); t += 2000   # combine
      rows.append((t, t + 300, tile, cta, 0, 4)); t += 300       # copy issue
  out = gt._tile_phases(np.array(rows, dtype=trace.RECORD_DTYPE))
  assert "rank 0 combining tiles     4: mean us mainloop 5.00 retire+stage 0.50 combine 2.00 issue 0.30" in out, out
  assert "rank 0 other     tiles     4: mean us mainloop 5.00 retire+stage 0.50 combine 0.00 issue 0.30" in out, out
  assert "band waits 4 summing 0.4 us" in out, out
