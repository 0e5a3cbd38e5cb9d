"""The fused TP+SP kernels' cost beyond their GEMM, measured on ONE GPU (loopback).

kosmos_jax/_loopback.py runs a group's `tp` ranks as `tp` concurrent launches on one
GPU, each with SMs/tp CTAs, its own heap and stream. A "peer" heap is then this GPU's
own memory: the movers copy at HBM speed, not NVLink speed. So a loopback call costs
the GEMM at SMs/tp CTAs, plus what the fused design adds on top of its GEMM (waits,
role switching, flag traffic, the copies themselves at HBM speed, the staged partials
and the reduction for RS), plus the ranks sharing HBM and L2. That isolates the
non-transport overheads that issue 6's "fused within 1.15x of our GEMM alone" bar is
about, on a machine without a second GPU; it says nothing about NVLink bandwidth.

Arms, per paper shape (M total rows, N and K per rank as the paper gives them;
DESIGN.md §7) at TP = --tp:
  gemm_full   ops.matmul TN impl="fused", one rank's GEMM [M, K] @ [K, N], all SMs
  gemm_cap    the same at cu_cap = SMs // tp (the CTAs one loopback rank has)
  pull, push  one loopback call of the fused kernel, every rank concurrently, per call
Derived: pull/gemm_cap and push/gemm_cap (fused overhead at equal CTAs, ranks sharing
the GPU), push/pull.

Timing: gemm arms with harness.time_fn (warm-up >= --settle-s, median of --reps windows
of --calls pipelined calls, rotated inputs); loopback arms: a warm-up run, then --reps
runs of --calls back-to-back calls each (fresh heaps per run; heap set-up not timed),
median. Inputs: random bf16 tiles (a 1 Mi-element random block repeated), so power
draw is that of real data.

  python3 benchmarks/loopback.py [--kernels ag_tn,tn_rs] [--shapes all|NAME,...] [--tp 2]
      [--calls 20] [--reps 3] [--budget-s 0] [--out-dir benchmarks/results]
Writes <out-dir>/loopback<tag>.csv and prints a markdown table (copied to $OUT when set).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import harness  # noqa: E402

from kosmos_jax import _loopback, ops  # noqa: E402

BF16 = jnp.bfloat16
COLUMNS = ("kernel", "shape", "tp", "M", "N", "K", "cap", "gemm_full_ms", "gemm_cap_ms", "pull_ms", "push_ms",
           "pull_vs_gemm_cap", "push_vs_gemm_cap", "push_vs_pull")


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--kernels", default="ag_tn,tn_rs")
  ap.add_argument("--shapes", default="all", help="all, or comma-separated paper shape names")
  ap.add_argument("--tp", type=int, default=2, help="loopback ranks (each gets SMs // tp CTAs)")
  ap.add_argument("--calls", type=int, default=20, help="calls per timed window / loopback run")
  ap.add_argument("--reps", type=int, default=3, help="timed windows / loopback runs per arm (median)")
  ap.add_argument("--settle-s", type=float, default=0.5, help="GEMM arms' warm-up seconds")
  ap.add_argument("--budget-s", type=float, default=0, help="stop starting shapes after this (0: no limit)")
  ap.add_argument("--out-dir", default=str(pathlib.Path(__file__).parent / "results"))
  ap.add_argument("--tag", default="")
  return ap.parse_args(argv)


def _tiles(rng, shape, scale=1.0):
  """A bf16 array of `shape` filled with one random 1 Mi-element block, repeated."""
  size = int(np.prod(shape))
  block = (scale * rng.standard_normal(min(size, 1 << 20), np.float32)).astype(BF16)
  return np.resize(block, size).reshape(shape)


def heap_mb(kernel, tp, rows, k, n) -> int:
  """Per-rank heap the call needs (AG: every rank's padded rows x k; RS: fp32 staging), plus slack."""
  need = tp * (-(-rows // 128) * 128) * k * 2 if kernel == "ag_tn" else tp * rows * n * 4
  return (need >> 20) + 64


def time_loopback(kernel, tp, rows, k, n, xs, ws, cap, push, args) -> float:
  """Median ms per call over args.reps runs of args.calls calls (after a 4-call warm-up run)."""
  kw = dict(cu_cap=cap, push=(push,), heap_mb=heap_mb(kernel, tp, rows, k, n), check=False)
  _loopback.run([kernel], tp, rows, k, n, xs, ws, calls=4, **kw)
  runs = [_loopback.run([kernel], tp, rows, k, n, xs, ws, calls=args.calls, **kw)[2] for _ in range(args.reps)]
  return statistics.median(runs) * 1e3 / args.calls


def time_gemm(M, k, n, cap, args) -> float:
  fn = jax.jit(lambda a, b: ops.matmul(a, b, layout="TN", impl="fused", cu_cap=cap))
  keys = iter(range(1000))
  sets = harness.rotation(
      lambda i: (jax.random.normal(jax.random.key(next(keys)), (M, k), BF16),
                 jax.random.normal(jax.random.key(next(keys)), (k, n), BF16)), 2 * (M * k + k * n))
  t = harness.time_fn(fn, sets, warmup=2, calls=args.calls, reps=args.reps, warmup_s=args.settle_s)
  return t.median_ms


def bench_shape(kernel, shape, args, sms) -> dict:
  M, N, K, tp = shape["M"], shape["N"], shape["K"], args.tp
  rows = M // tp  # AG: local rows per rank; RS: rows per output chunk
  cap = sms // tp
  rng = np.random.default_rng(0)
  x_rows = rows if kernel == "ag_tn" else M
  xs = [[_tiles(rng, (x_rows, K)) for _ in range(tp)]]
  ws = [[_tiles(rng, (K, N), K ** -0.5) for _ in range(tp)]]
  row = dict(kernel=kernel, shape=shape["name"], tp=tp, M=M, N=N, K=K, cap=cap)
  row["gemm_full_ms"] = time_gemm(M, K, N, None, args)
  row["gemm_cap_ms"] = time_gemm(M, K, N, cap, args)
  row["pull_ms"] = time_loopback(kernel, tp, rows, K, N, xs, ws, cap, 0, args)
  row["push_ms"] = time_loopback(kernel, tp, rows, K, N, xs, ws, cap, 1, args)
  row["pull_vs_gemm_cap"] = row["pull_ms"] / row["gemm_cap_ms"]
  row["push_vs_gemm_cap"] = row["push_ms"] / row["gemm_cap_ms"]
  row["push_vs_pull"] = row["push_ms"] / row["pull_ms"]
  return row


def table(rows) -> str:
  head = "| kernel | shape | gemm all SMs ms | gemm cap ms | pull ms | push ms | pull / gemm cap | push / gemm cap | push / pull |"
  lines = [head, "|" + " --- |" * 9]
  for r in rows:
    lines.append(f"| {r['kernel']} | {r['shape']} | {r['gemm_full_ms']:.3f} | {r['gemm_cap_ms']:.3f} | "
                 f"{r['pull_ms']:.3f} | {r['push_ms']:.3f} | {r['pull_vs_gemm_cap']:.3f} | "
                 f"{r['push_vs_gemm_cap']:.3f} | {r['push_vs_pull']:.3f} |")
  for kernel in sorted({r["kernel"] for r in rows}):
    rs = [r for r in rows if r["kernel"] == kernel]
    gm = lambda key: float(np.exp(np.mean([np.log(r[key]) for r in rs])))
    lines.append(f"\n{kernel}: {len(rs)} shapes; geomean pull / gemm cap {gm('pull_vs_gemm_cap'):.3f}, "
                 f"push / gemm cap {gm('push_vs_gemm_cap'):.3f}, push / pull {gm('push_vs_pull'):.3f}; "
                 f"worst pull / gemm cap {max(r['pull_vs_gemm_cap'] for r in rs):.3f}, "
                 f"push {max(r['push_vs_gemm_cap'] for r in rs):.3f}")
  return "\n".join(lines)


def main(argv=None):
  args = parse_args(argv)
  sms = jax.devices()[0].core_count
  rows, t0 = [], time.time()
  for kernel in args.kernels.split(","):
    shapes = harness.paper_shapes(kernel)
    if args.shapes != "all":
      want = set(args.shapes.split(","))
      shapes = [s for s in shapes if s["name"] in want]
    for shape in shapes:
      if args.budget_s and time.time() - t0 > args.budget_s:
        print(f"budget: stopped before {kernel} {shape['name']}", flush=True)
        break
      rows.append(bench_shape(kernel, shape, args, sms))
      r = rows[-1]
      print(f"{kernel} {shape['name']}: gemm {r['gemm_full_ms']:.3f} / cap {r['gemm_cap_ms']:.3f} ms, "
            f"pull {r['pull_ms']:.3f}, push {r['push_ms']:.3f} ms", flush=True)
  out = pathlib.Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  csv_path = out / f"loopback{args.tag}.csv"
  harness.write_csv([{c: r[c] for c in COLUMNS} for r in rows], csv_path)
  text = table(rows)
  print(text)
  (out / f"loopback{args.tag}.md").write_text(text + "\n")
  if os.environ.get("OUT"):
    for p in (csv_path, out / f"loopback{args.tag}.md"):
      shutil.copy(p, os.environ["OUT"])


if __name__ == "__main__":
  main()
