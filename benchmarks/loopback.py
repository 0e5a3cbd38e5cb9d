"""The fused TP+SP kernels' cost beyond their GEMM, measured on ONE GPU (loopback).

kosmos_jax/testing/loopback.py runs a group's `tp` ranks as `tp` concurrent launches on one
GPU, each with SMs/tp CTAs, its own heap and stream. A "peer" heap is then this GPU's
own memory: the movers copy at HBM speed, not NVLink speed. The tp ranks together do tp
GEMMs on one GPU, so the yardstick is tp x our GEMM alone on all SMs; what a loopback
call costs beyond that is what the fused design adds (waits, role switching, flag
traffic, the copies at HBM speed, RS's staged partials and reduction), plus the
ranks' concurrent kernels sharing the GPU less well than one GEMM uses it. That
isolates the non-NVLink overheads behind issue 6's "fused within 1.15x of our GEMM
alone" bar on a machine without a second GPU; it says nothing about NVLink.

Arms, per paper shape (the GEMM's M, N and K as the paper gives them; DESIGN.md §7)
at TP = --tp, for the five kernels (KERNELS below maps a shape onto each op's operands):
  gemm_full   ops.matmul impl="fused" in the kernel's layout (TN forward, NN dgrad, NT
              wgrad), one rank's GEMM of the shape, all SMs
  gemm_cap    the same at cu_cap = SMs // tp, alone on the GPU (the CTAs one loopback
              rank has; faster per SM than a full GPU's share, as it has the whole
              power budget, HBM and L2; for reference only)
  --arms      loopback calls of the fused kernel, every rank concurrently, per call;
              an arm is "pull", "push" or (RS) "push_fold" plus optional "+fp32" (RS partials staged
              fp32), "+bandsN" (RS band rows), "+crewN" (initial movers / reducers);
              what it leaves out is what the ops pick (kosmos_jax.kernel_config: ag_movers,
              rs_reducers, rs_band_rows, bf16 staging)
Derived: <arm>_vs_gemm = arm / (tp x gemm_full).

Timing: gemm arms with harness.time_fn (warm-up >= --settle-s, median of --reps windows
of --calls pipelined calls, rotated inputs); loopback arms: a warm-up run, then --reps
runs of --calls back-to-back calls each (fresh heaps per run; heap set-up not timed),
median. Inputs: random bf16 tiles (a 1 Mi-element random block repeated), so power
draw is that of real data.

  python3 benchmarks/loopback.py [--kernels ag_tn,tn_rs,ag_nn,bulk_ag_nn,bulk_rs_nt] [--shapes all|NAME,...] [--tp 2]
      [--arms pull,push] [--calls 20] [--reps 3] [--budget-s 0] [--out-dir benchmarks/results]
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

from kosmos_jax import kernel_config as config, ops  # noqa: E402
from kosmos_jax.testing import loopback as _loopback  # noqa: E402
from kosmos_jax.testing import builder_runs  # noqa: E402

BF16 = jnp.bfloat16


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--kernels", default="ag_tn,tn_rs")
  ap.add_argument("--shapes", default="all", help="all, or comma-separated paper shape names")
  ap.add_argument("--tp", type=int, default=2, help="loopback ranks (each gets SMs // tp CTAs)")
  ap.add_argument("--arms", default="pull,push", help="comma-separated arms, e.g. pull,push,pull+fp32,push+crew8")
  ap.add_argument("--calls", type=int, default=20, help="calls per timed window / loopback run")
  ap.add_argument("--reps", type=int, default=3, help="timed windows / loopback runs per arm (median)")
  ap.add_argument("--settle-s", type=float, default=0.5, help="GEMM arms' warm-up seconds")
  ap.add_argument("--budget-s", type=float, default=0, help="stop starting shapes after this (0: no limit)")
  ap.add_argument("--out-dir", default=str(pathlib.Path(__file__).parent / "results"))
  ap.add_argument("--tag", default="")
  ap.add_argument("--gemm-cap", action=argparse.BooleanOptionalAction, default=True,
                  help="also time the capped GEMM (reference only; --no-gemm-cap saves a third of the time)")
  return ap.parse_args(argv)


def _tiles(rng, shape, scale=1.0):
  """A bf16 array of `shape` filled with one random 1 Mi-element block, repeated."""
  size = int(np.prod(shape))
  block = (scale * rng.standard_normal(min(size, 1 << 20), np.float32)).astype(BF16)
  return np.resize(block, size).reshape(shape)


# Per kernel: the loopback dims (rows per rank, k, n; csrc/loopback.h's table) of a
# paper shape, the yardstick GEMM's layout, and its operands' shapes.
def _dims(kernel, shape, tp):
  M, N, K = shape["M"], shape["N"], shape["K"]
  if kernel in ("ag_tn", "tn_rs"):
    return M // tp, K, N      # x [.., K] @ w [K, N]
  if kernel in ("ag_nn", "bulk_ag_nn"):
    return M // tp, N, K      # dX [M, N] = dY [M, K] @ w.T, w [N, K]: the op's k = N, n = K
  return K // tp, N, M        # bulk_rs_nt: dW [M, N] summed over K tokens; ours is x.T @ dy = [N, M]


LAYOUT = {"ag_tn": "TN", "tn_rs": "TN", "ag_nn": "NN", "bulk_ag_nn": "NN", "bulk_rs_nt": "NT"}


def gemm_operands(kernel, tp, rows, k, n):
  """Shapes (a, b) of one rank's GEMM of the fused op, in ops.matmul's layout."""
  M = tp * rows
  return {"TN": ((M, k), (k, n)), "NN": ((M, n), (k, n)), "NT": ((M, k), (M, n))}[LAYOUT[kernel]]


def loopback_inputs(kernel, rng, tp, rows, k, n):
  """One rank's inputs of `kernel` in loopback order (csrc/loopback.h), random bf16 tiles."""
  M = tp * rows
  t = lambda shape, scale=1.0: _tiles(rng, shape, scale)
  return {"ag_tn": lambda: [t((rows, k)), t((k, n), k ** -0.5)],
          "tn_rs": lambda: [t((M, k)), t((k, n), k ** -0.5)],
          "ag_nn": lambda: [t((rows, n)), t((k, n), n ** -0.5)],
          "bulk_ag_nn": lambda: [t((rows, k)), t((M, n)), t((k, n), n ** -0.5)],
          "bulk_rs_nt": lambda: [t((M, k)), t((M, k)), t((M, n), M ** -0.5)]}[kernel]()


def heap_mb(kernel, tp, rows, k, n) -> int:
  """Per-rank heap the call needs, plus slack: AG ops every rank's padded rows of the
  gathered width; RS ops their fp32 staging of the scattered rows."""
  padded = -(-rows // 128) * 128
  need = {"ag_tn": tp * padded * k * 2, "ag_nn": tp * padded * n * 2, "bulk_ag_nn": tp * padded * k * 2,
          "tn_rs": tp * rows * n * 4, "bulk_rs_nt": tp * rows * k * 4}[kernel]
  return (need >> 20) + 64


def arm_knobs(arm, kernel, k, n, cap=None, sms=None) -> dict:
  """Loopback keyword arguments of `arm` ("pull"/"push" + "+fp32", "+bandsN", "+crewN"),
  the rest as the ops choose them (kosmos_jax.kernel_config) for a grid of
  `cap` CTAs on a GPU of `sms` SMs."""
  transport, *mods = arm.split("+")
  if transport not in config.RS_TRANSPORTS or (transport == "push_fold" and kernel != "tn_rs"):
    raise ValueError(f"arm {arm!r}: must start with pull or push (or push_fold, tn_rs only)")
  if kernel in ("ag_nn", "bulk_ag_nn") and transport != "pull":
    raise ValueError(f"arm {arm!r}: {kernel} gathers by pull only")
  kw = dict(transports=(transport,))
  if kernel == "ag_tn":
    kw["knob"] = config.ag_movers(n)
  elif kernel in ("ag_nn", "bulk_ag_nn"):
    kw["knob"] = config.ag_movers(k)  # as the fused ops pass it: the output width
  elif kernel == "bulk_rs_nt":
    kw["knob"] = -1  # the kernel's default crew
  else:
    reducers = 0 if transport == "push_fold" else config.rs_reducers(k, cap, sms)  # as tn_rs_fused passes them
    kw.update(knob=reducers, stage_bf16=True, band_rows=config.rs_band_rows(n, k))
  for m in mods:
    if m == "fp32" and kernel == "tn_rs":
      kw["stage_bf16"] = False
    elif m.startswith("bands") and kernel == "tn_rs":
      kw["band_rows"] = int(m[5:])
    elif m.startswith("crew"):
      kw["knob"] = int(m[4:])
    else:
      raise ValueError(f"arm {arm!r}: modifier {m!r} does not apply to {kernel} (fp32 and bandsN are tn_rs only)")
  return kw


def time_loopback(kernel, tp, rows, k, n, inputs, cap, arm, args) -> float:
  """Median ms per call over args.reps runs of args.calls calls (after a 4-call warm-up run)."""
  kw = dict(cu_cap=cap, heap_mb=heap_mb(kernel, tp, rows, k, n), check=False,
            **arm_knobs(arm, kernel, k, n, cap, jax.devices()[0].core_count))
  before = builder_runs()[kernel]["sm90"]
  _loopback.run([kernel], tp, rows, k, n, inputs, calls=4, **kw)
  runs = [_loopback.run([kernel], tp, rows, k, n, inputs, calls=args.calls, **kw)[2] for _ in range(args.reps)]
  ran, want = builder_runs()[kernel]["sm90"] - before, tp * (4 + args.reps * args.calls)
  if ran != want:  # a number from the portable builders must not pass for the Hopper kernel's
    raise RuntimeError(f"{kernel} {arm}: the Hopper builders ran {ran} of {want} launches")
  return statistics.median(runs) * 1e3 / args.calls


def time_gemm(layout, a_shape, b_shape, cap, args) -> float:
  fn = jax.jit(lambda a, b: ops.matmul(a, b, layout=layout, impl="fused", cu_cap=cap))
  keys = iter(range(1000))
  sets = harness.rotation(
      lambda i: (jax.random.normal(jax.random.key(next(keys)), a_shape, BF16),
                 jax.random.normal(jax.random.key(next(keys)), b_shape, BF16)),
      2 * (int(np.prod(a_shape)) + int(np.prod(b_shape))))
  t = harness.time_fn(fn, sets, warmup=2, calls=args.calls, reps=args.reps, warmup_s=args.settle_s)
  return t.median_ms


def bench_shape(kernel, shape, args, sms) -> dict:
  tp = args.tp
  rows, k, n = _dims(kernel, shape, tp)  # local rows per rank (RS: rows per output chunk)
  cap = sms // tp
  rng = np.random.default_rng(0)
  inputs = [[loopback_inputs(kernel, rng, tp, rows, k, n) for _ in range(tp)]]
  row = dict(kernel=kernel, shape=shape["name"], tp=tp, M=shape["M"], N=shape["N"], K=shape["K"], cap=cap)
  a_shape, b_shape = gemm_operands(kernel, tp, rows, k, n)
  row["gemm_full_ms"] = time_gemm(LAYOUT[kernel], a_shape, b_shape, None, args)
  row["gemm_cap_ms"] = time_gemm(LAYOUT[kernel], a_shape, b_shape, cap, args) if args.gemm_cap else float("nan")
  for arm in _arms(kernel, args.arms):
    row[f"{arm}_ms"] = time_loopback(kernel, tp, rows, k, n, inputs, cap, arm, args)
    row[f"{arm}_vs_gemm"] = row[f"{arm}_ms"] / (tp * row["gemm_full_ms"])
  return row


def _arms(kernel, arms: str) -> list[str]:
  """The --arms that apply to `kernel` (the AG backward ops gather by pull only,
  bulk_rs_nt's reduce-scatter is push only)."""
  out = [a for a in arms.split(",")
         if not (kernel in ("ag_nn", "bulk_ag_nn") and not a.startswith("pull"))
         and not (kernel == "bulk_rs_nt" and a.split("+")[0] != "push")
         and not (kernel != "tn_rs" and a.startswith("push_fold"))]
  if not out:
    raise SystemExit(f"no arm of {arms!r} applies to {kernel}")
  return out


def table(rows, arms) -> str:
  head = "| kernel | shape | gemm all SMs ms | gemm cap ms | " + " | ".join(f"{a} ms / vs tp x gemm" for a in arms) + " |"
  lines = [head, "|" + " --- |" * (4 + len(arms))]
  for r in rows:
    cells = " | ".join(f"{r[a + '_ms']:.3f} / {r[a + '_vs_gemm']:.3f}" if a + "_ms" in r else "-" for a in arms)
    lines.append(f"| {r['kernel']} | {r['shape']} | {r['gemm_full_ms']:.3f} | {r['gemm_cap_ms']:.3f} | {cells} |")
  for kernel in sorted({r["kernel"] for r in rows}):
    rs = [r for r in rows if r["kernel"] == kernel]
    parts = []
    for a in arms:
      v = [r[a + "_vs_gemm"] for r in rs if a + "_vs_gemm" in r]
      if not v:
        continue
      parts.append(f"{a} geomean {float(np.exp(np.mean(np.log(v)))):.3f}, worst {max(v):.3f}")
    lines.append(f"\n{kernel}: {len(rs)} shapes, arm / (tp x gemm all SMs): " + "; ".join(parts))
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
      print(f"{kernel} {shape['name']}: gemm {r['gemm_full_ms']:.3f} / cap {r['gemm_cap_ms']:.3f} ms, " +
            ", ".join(f"{a} {r[a + '_ms']:.3f}" for a in _arms(kernel, args.arms)), flush=True)
  out = pathlib.Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  if not rows:
    raise SystemExit("no shape ran (check --shapes and --budget-s)")
  csv_path = out / f"loopback{args.tag}.csv"
  harness.write_csv(rows, csv_path)
  text = table(rows, args.arms.split(","))
  print(text)
  (out / f"loopback{args.tag}.md").write_text(text + "\n")
  if os.environ.get("OUT") and pathlib.Path(os.environ["OUT"]).resolve() != out.resolve():
    for p in (csv_path, out / f"loopback{args.tag}.md"):
      shutil.copy(p, os.environ["OUT"])


if __name__ == "__main__":
  main()
