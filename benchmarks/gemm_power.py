"""Sustained-load SM clock and board power of XLA's dot (cuBLAS) against kosmos_matmul.

Issue 5's open question (benchmarks/RESULTS.md, 2026-12-01): XLA's dot runs ~10% faster than ours
on mid-size shapes but not on the largest, whose timed repetitions last longest. If our kernel
spends more energy per FLOP, a power-capped GPU lowers its clock sooner. This runs each arm for
`--seconds` of back-to-back calls (arms alternate, twice each) while `nvidia-smi -lms` samples
clocks.sm, power.draw and temperature (read only: it never changes a setting), then prints per arm
TF/s, median clock, median power and GFLOP per joule.

  python3 benchmarks/gemm_power.py [--layout TN] [--shapes 70B-FC1-MBS1,405B-FC1-MBS8] [--seconds 3]
  python3 benchmarks/gemm_power.py --impl reference --mnk 256,256,256 --seconds 0.2   # CPU smoke run
Writes benchmarks/out/gemm_power.csv (--out). Its last run: benchmarks/RESULTS.md, ops.matmul.
"""
from __future__ import annotations

import argparse
import functools
import pathlib
import shutil
import statistics
import subprocess
import sys
import threading
import time

import jax

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import gemm as gemm_bench  # noqa: E402  (operand shapes, XLA's dot, input maker)
import harness  # noqa: E402
from kosmos_jax import ops  # noqa: E402


class Sampler:
  """nvidia-smi rows (monotonic time, SM MHz, W, deg C) every `period_ms`, from a reader thread."""

  def __init__(self, period_ms: int = 50):
    self.rows: list[tuple[float, float, float, float]] = []
    self.proc = None
    if shutil.which("nvidia-smi") is None:
      return
    self.proc = subprocess.Popen(
        ["nvidia-smi", "--id=0", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
         "--format=csv,noheader,nounits", f"-lms={period_ms}"], stdout=subprocess.PIPE, text=True)
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self):
    for line in self.proc.stdout:
      try:
        mhz, watts, temp = (float(v) for v in line.split(","))
      except ValueError:
        continue  # "[N/A]" or a partial line
      self.rows.append((time.monotonic(), mhz, watts, temp))

  def window(self, t0: float, t1: float):
    return [r for r in self.rows if t0 <= r[0] <= t1]

  def stop(self):
    if self.proc is not None:
      self.proc.terminate()


def sustain(fn, sets, seconds: float) -> tuple[int, float, float]:
  """Calls fn back to back for `seconds` (synced every 8 calls); returns (calls, start, end)."""
  out = fn(*sets[0])
  jax.block_until_ready(out)
  n, t0 = 0, time.monotonic()
  while time.monotonic() - t0 < seconds:
    for _ in range(8):
      out = fn(*sets[n % len(sets)])
      n += 1
    jax.block_until_ready(out)
  return n, t0, time.monotonic()


def arms(layout: str, impl: str):
  xla = gemm_bench.xla_dot(layout)
  ours = jax.jit(functools.partial(ops.matmul, layout=layout, impl=impl))
  return {"xla_cublas": xla, f"kosmos_{impl}": ours}


def measure_shape(name, layout, M, N, K, impl, seconds, sampler):
  flop = 2.0 * M * N * K
  sets = harness.rotation(lambda i: gemm_bench.make_inputs(layout, M, N, K, i), 2 * (M * K + N * K))
  rows = []
  for rep in range(2):
    for arm, fn in arms(layout, impl).items():
      n, t0, t1 = sustain(fn, sets, seconds)
      dt = t1 - t0
      # Skip the first 20% of the window: the clock settles after the arm starts.
      w = sampler.window(t0 + 0.2 * (t1 - t0), t1)
      med = lambda i: statistics.median(r[i] for r in w) if w else float("nan")
      tf = n * flop / dt * 1e-12
      rows.append(dict(shape=name, layout=layout, M=M, N=N, K=K, arm=arm, rep=rep, calls=n, seconds=dt,
                       tflops=tf, sm_mhz=med(1), watts=med(2), temp_c=med(3), samples=len(w),
                       gflop_per_joule=tf * 1e3 / med(2) if w else float("nan")))
      r = rows[-1]
      print(f"{name:16s} {layout} {arm:16s} rep {rep}: {r['tflops']:6.1f} TF/s  {r['sm_mhz']:6.0f} MHz  "
            f"{r['watts']:6.1f} W  {r['temp_c']:4.0f} C  {r['gflop_per_joule']:6.1f} GFLOP/J  ({n} calls)",
            flush=True)
  return rows


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--layout", default="TN", choices=("TN", "NN", "NT"))
  ap.add_argument("--shapes", default="70B-FC1-MBS1,8B-FC1-MBS2,405B-FC1-MBS8",
                  help="paper shape names of the layout's kernel (benchmarks/gemm.py's map)")
  ap.add_argument("--mnk", default="", help="M,N,K of one custom problem instead of --shapes")
  ap.add_argument("--seconds", type=float, default=3.0)
  ap.add_argument("--impl", default="fused", choices=("fused", "reference"))
  ap.add_argument("--out", default=str(harness.HERE / "out" / "gemm_power.csv"))
  args = ap.parse_args()
  if args.mnk:
    M, N, K = (int(v) for v in args.mnk.split(","))
    shapes = [dict(name=f"{M}x{N}x{K}", M=M, N=N, K=K)]
  else:
    want = args.shapes.split(",")
    table = {s["name"]: s for s in harness.paper_shapes(gemm_bench.KERNEL_OF[args.layout])}
    missing = [w for w in want if w not in table]
    if missing:
      raise SystemExit(f"unknown shapes {missing} for {args.layout}; known: {sorted(table)}")
    shapes = [table[w] for w in want]
  sampler = Sampler()
  if sampler.proc is None:
    print("nvidia-smi not found: clock and power columns are NaN")
  rows = []
  try:
    for sh in shapes:
      rows += measure_shape(sh["name"], args.layout, sh["M"], sh["N"], sh["K"], args.impl, args.seconds, sampler)
  finally:
    sampler.stop()
  harness.write_csv(rows, pathlib.Path(args.out))


if __name__ == "__main__":
  main()
