"""One profiled call each of XLA's dot (cuBLAS) and kosmos_matmul on one paper shape, for ncu.

Compiles and warms both arms first (XLA autotunes its dot at compile time, launching many candidate
kernels), then brackets exactly one call of each arm with cuProfilerStart/Stop, so that
`ncu --profile-from-start off` records the two GEMM kernels and nothing else:

  ncu --profile-from-start off --clock-control none --section SpeedOfLight python3 \
      benchmarks/gemm_profile_once.py --layout TN --shape 70B-FC1-MBS1
(`bash scripts/gpu_profile.sh ncu` wraps this with the sections it records.) Without ncu the bracket is a
no-op and the script only runs; --impl reference runs it on CPU.
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import pathlib
import sys

import jax

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import gemm as gemm_bench  # noqa: E402  (operand shapes, XLA's dot, input maker)
import harness  # noqa: E402
from kosmos_jax import ops  # noqa: E402


def cuda_profiler():
  """(start, stop) of the CUDA driver's profiler range; no-ops where there is no libcuda."""
  try:
    cuda = ctypes.CDLL("libcuda.so.1")
  except OSError:
    return (lambda: None), (lambda: None)
  return cuda.cuProfilerStart, cuda.cuProfilerStop


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--layout", default="TN", choices=("TN", "NN", "NT"))
  ap.add_argument("--shape", default="70B-FC1-MBS1", help="paper shape name (benchmarks/gemm.py's map)")
  ap.add_argument("--impl", default="fused", choices=("fused", "reference"))
  args = ap.parse_args()
  table = {s["name"]: s for s in harness.paper_shapes(gemm_bench.KERNEL_OF[args.layout])}
  if args.shape not in table:
    raise SystemExit(f"unknown shape {args.shape!r} for {args.layout}; known: {sorted(table)}")
  sh = table[args.shape]
  a, b = gemm_bench.make_inputs(args.layout, sh["M"], sh["N"], sh["K"], 0)
  arms = {"xla_cublas": gemm_bench.xla_dot(args.layout),
          "kosmos": jax.jit(functools.partial(ops.matmul, layout=args.layout, impl=args.impl))}
  for fn in arms.values():  # compile, autotune, warm up
    for _ in range(3):
      jax.block_until_ready(fn(a, b))
  start, stop = cuda_profiler()
  for name, fn in arms.items():
    start()
    jax.block_until_ready(fn(a, b))
    stop()
    print(f"profiled {name}: {args.layout} {args.shape} M={sh['M']} N={sh['N']} K={sh['K']}", flush=True)


if __name__ == "__main__":
  main()
