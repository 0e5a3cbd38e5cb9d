"""The one benchmark harness (DESIGN.md §7): warm-up, then pipelined calls synchronized
once per repetition, the slowest rank's median, inputs rotated so the L2 cache does
not flatter, CSV + PNG, and a summary appended to benchmarks/RESULTS.md.

Benchmarks measure; tests never time.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime
import hashlib
import json
import math
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Callable, Sequence

import jax
import numpy as np

HERE = pathlib.Path(__file__).parent
SHAPES = HERE / "data" / "paper_tp_shapes.json"  # copy of ../shared/data (the device gets the repo only)
RESULTS = HERE / "RESULTS.md"
L2_BYTES = 60 << 20  # H200 L2 is 50 MiB; rotate through more than that


@dataclasses.dataclass(frozen=True)
class Timing:
  median_ms: float
  min_ms: float
  reps: int
  calls_per_rep: int


def paper_shapes(kernel: str) -> list[dict]:
  """The paper's 24 Llama-3 shapes of `kernel` (ag_tn, tn_rs, ag_nn, bulk_ag_nn, bulk_rs_nt)."""
  return json.loads(SHAPES.read_text())["kernels"][kernel]["shapes"]


def rotation(make_inputs: Callable[[int], tuple], bytes_per_set: int) -> list[tuple]:
  """Enough distinct input sets that one pass through them overflows the L2."""
  n = max(2, min(16, -(-L2_BYTES // max(bytes_per_set, 1))))
  return [make_inputs(i) for i in range(n)]


def _slowest_rank(ms: float) -> float:
  if jax.process_count() == 1:
    return ms  # one process: the host wall clock already waits for every device
  from jax.experimental import multihost_utils
  return float(np.max(multihost_utils.process_allgather(np.array([ms]))))


def _warm(step: Callable[[int], object], first: int, seconds: float) -> None:
  """Calls step(0), step(1), ...: `first` times (at least once if seconds > 0), then as many
  more as their pace needs to fill `seconds`. step(0) is not part of the pace (it may compile:
  XLA autotunes a dot for seconds). The count comes from the slowest rank's pace, so every
  process makes the same calls: a collective arm on a rank that made one call more would wait
  for its peers forever."""
  first = max(first, 1 if seconds > 0 else 0)
  if first == 0:
    return
  jax.block_until_ready(step(0))
  n = max(first - 1, 1)
  out, t0 = None, time.perf_counter()
  for i in range(1, 1 + n):
    out = step(i)
    if i % 8 == 7:
      jax.block_until_ready(out)  # keep the clock check honest: time the work, not the queueing
  jax.block_until_ready(out)
  ms = _slowest_rank((time.perf_counter() - t0) * 1e3)
  for i in range(1 + n, 1 + n + math.ceil(max(0.0, seconds * 1e3 - ms) / max(ms / n, 1e-6))):
    out = step(i)
    if i % 8 == 7:
      jax.block_until_ready(out)
  jax.block_until_ready(out)


def time_fn(fn: Callable, input_sets: Sequence[tuple], *, warmup: int = 5, calls: int = 20,
            reps: int = 5, warmup_s: float = 0.25) -> Timing:
  """Median over `reps` of (time of `calls` pipelined calls, synced once) / calls.

  Warm-up runs at least `warmup` calls *and* at least `warmup_s` seconds: an idle
  GPU sits at a low clock between measurements (seen at 345 MHz on H200), and a
  couple of calls do not bring it back, which flatters whichever arm runs later.
  """
  _warm(lambda i: fn(*input_sets[i % len(input_sets)]), warmup, warmup_s)
  per_call = []
  for _ in range(reps):
    t0 = time.perf_counter()
    for i in range(calls):
      out = fn(*input_sets[i % len(input_sets)])
    jax.block_until_ready(out)
    per_call.append(_slowest_rank((time.perf_counter() - t0) * 1e3 / calls))
  return Timing(statistics.median(per_call), min(per_call), reps, calls)


def time_interleaved(fns: dict[str, Callable], input_sets: Sequence[tuple] | dict[str, Sequence[tuple]], *,
                     calls: int | dict[str, int] = 20, rounds: int = 7, warmup_s: float = 1.0) -> dict[str, Timing]:
  """Per arm, the median over `rounds` of (time of `calls` pipelined calls, synced once) / calls,
  the arms' windows interleaved back to back: round r runs every arm once, in turn, reversing the
  order each round (ABC, CBA, ...), after a warm-up that runs them in turn for `warmup_s`.
  input_sets and calls are shared, or given per arm (dicts keyed like fns).

  Why: an H200 under GEMM load runs at its 700 W power limit, and what a kernel achieves depends
  on how long the load has lasted and on what ran just before. Timed in its own 0.3 s
  block, XLA's dot ran 750-790 TF/s on mid-size shapes, but 670-700 interleaved with ours and
  ~670 after 2.5 s of sustained load (2026-12-01, benchmarks/RESULTS.md); ours ran ~650-700 in
  all three. Whichever arm went first, the block protocol gave XLA's dot that margin, so it is
  not an idle-gap effect; a transient of the power management that favours one kernel is the
  likely cause (clocks were not sampled in those blocks). Interleaved
  windows put every arm in the same, sustained state, as a training step's GEMMs run.
  """
  names = list(fns)
  sets = {n: input_sets[n] if isinstance(input_sets, dict) else input_sets for n in names}
  count = {n: calls[n] if isinstance(calls, dict) else calls for n in names}

  def window(name, n):
    out = None
    for i in range(n):
      out = fns[name](*sets[name][i % len(sets[name])])
    jax.block_until_ready(out)

  _warm(lambda _: [window(name, max(2, count[name] // 4)) for name in names], 0, warmup_s)
  per_call = {name: [] for name in names}
  for r in range(rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
      t = time.perf_counter()
      window(name, count[name])
      per_call[name].append(_slowest_rank((time.perf_counter() - t) * 1e3 / count[name]))
  return {name: Timing(statistics.median(v), min(v), rounds, count[name]) for name, v in per_call.items()}


def time_sustained(fns: dict[str, Callable], input_sets: Sequence[tuple], *, calls: int = 20, reps: int = 5,
                   settle_s: float = 2.0) -> dict[str, Timing]:
  """Per arm in turn: `settle_s` seconds of back-to-back calls (synced every 8), then the median
  over `reps` of (time of `calls` pipelined calls, synced once) / calls. Each arm is timed in its
  own steady state under the power limit, as a long run of that kernel alone would see it; the
  counterpart of time_interleaved (shared state) and of time_fn's short blocks (the transient).
  """
  return {name: time_fn(fn, input_sets, warmup=2, calls=calls, reps=reps, warmup_s=settle_s)
          for name, fn in fns.items()}


def write_csv(rows: list[dict], path: pathlib.Path) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  fields = list(dict.fromkeys(k for r in rows for k in r))  # every row's columns, first-seen order
  with path.open("w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields, restval="")
    w.writeheader()
    w.writerows(rows)


def bar_plot(names: Sequence[str], series: dict[str, Sequence[float]], path: pathlib.Path,
             *, ylabel: str, title: str, ref_line: float | None = 1.0) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(names) * len(series)), 4.5))
  width = 0.8 / len(series)
  x = np.arange(len(names))
  for i, (label, vals) in enumerate(series.items()):
    ax.bar(x + i * width, vals, width, label=label)
  if ref_line is not None:
    ax.axhline(ref_line, color="k", lw=0.8)
  ax.set_xticks(x + 0.4 - width / 2, names, rotation=60, ha="right", fontsize=7)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.legend(fontsize=8)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)


def source_digest() -> str:
  """sha1 (12 hex) over the code that runs: every file under csrc/, kernels/ and
  kosmos_jax/ (paths and contents, sorted). Identifies the code even where the
  checkout's .git is stale or missing (a copied tree); compare it with the same
  digest of a commit to find which one ran."""
  root = HERE.parent
  h = hashlib.sha1()
  for sub in ("csrc", "kernels", "kosmos_jax"):
    for p in sorted((root / sub).rglob("*")):
      if p.is_file() and p.suffix in (".py", ".h", ".cuh", ".cu", ".cc"):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
  return h.hexdigest()[:12]


def environment() -> dict:
  """Date, device, commit, source digest and command: the header of every RESULTS.md entry."""
  try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE, check=True).stdout.strip()
  except Exception:  # not a git checkout (e.g. a copied tree)
    commit = "unknown"
  commit += f" (source digest {source_digest()})"
  dev = jax.devices()[0]
  return {"date": datetime.date.today().isoformat(), "device": f"{len(jax.devices())} x {dev.device_kind}",
          "commit": commit, "command": " ".join(["python"] + sys.argv), "jax": jax.__version__}


def append_results(title: str, body_md: str) -> None:
  env = environment()
  head = (f"\n## {title}\n\n- date: {env['date']}\n- device: {env['device']}\n"
          f"- commit: {env['commit']}\n- jax: {env['jax']}\n- command: `{env['command']}`\n\n")
  with RESULTS.open("a") as f:
    f.write(head + body_md.rstrip() + "\n")
