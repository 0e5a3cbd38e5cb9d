"""Loopback runs (csrc/loopback.h): one fused call's `tp` ranks as `tp`
concurrent launches on one GPU, each rank with its own heap, stream, inputs and
output, through the handlers' own launch path. Checks the device protocol
(flags, epochs, ready/HeapUse handshakes, push writes) where peers are not lent;
its timings are not NVLink numbers.

run() builds `sets` input sets of fresh random bf16 data, runs `calls` calls
cycling through them (call i: set i % sets, transport push[i % len(push)]) with
NaN-poisoned outputs, and returns every set's first outputs, the float64 oracle
of each, and how many 16-bit words of every later call differed from its set's
first call (bitwise reproducibility and no stale data: consecutive calls use
different inputs)."""
import dataclasses

import jax.numpy as jnp
import numpy as np

from kosmos_jax import _ext, runtime

BF16 = jnp.bfloat16


@dataclasses.dataclass
class Loopback:
  outputs: list     # [set][rank] np.ndarray bf16: the set's first call
  oracles: list     # [set][rank] np.ndarray float64
  mismatches: list  # per call: differing 16-bit words against its set's first call
  seconds: float


def _module():
  mod, why = _ext._module()
  if mod is None or not hasattr(mod, "loopback_run"):
    raise RuntimeError(f"loopback needs the CUDA extension: {why or 'built without CUDA'}")
  return mod


def _oracle(op, xs, ws, rank, tp, rows):
  f64 = lambda a: np.asarray(a, np.float32).astype(np.float64)
  if op == "ag_tn":  # y_r = [x_0; ...; x_{tp-1}] @ w_r
    return np.concatenate([f64(x) for x in xs]) @ f64(ws[rank])
  # y_r = sum_q (x_q @ w_q)[rows of chunk r]
  return sum(f64(xs[q][rank * rows:(rank + 1) * rows]) @ f64(ws[q]) for q in range(tp))


def run(op, tp, rows, k, n, *, cu_cap, calls, sets=2, push=(0,), knob=-1, switching=True, stage_bf16=False,
        band_rows=1, heap_mb=256, seed=0, ordinal=0) -> Loopback:
  runtime.init()  # prepares the kernels on every local device
  rng = np.random.default_rng(seed)
  x_rows = rows if op == "ag_tn" else tp * rows
  xs = [[rng.standard_normal((x_rows, k), np.float32).astype(BF16) for _ in range(tp)] for _ in range(sets)]
  ws = [[(rng.standard_normal((k, n), np.float32) / np.sqrt(k)).astype(BF16) for _ in range(tp)]
        for _ in range(sets)]
  first, mism, secs = _module().loopback_run(
      ordinal, op, tp, rows, k, n, cu_cap, knob, int(switching), int(stage_bf16), band_rows,
      [int(p) for p in push], calls, heap_mb << 20, [[a.tobytes() for a in s] for s in xs],
      [[a.tobytes() for a in s] for s in ws])
  y_rows = tp * rows if op == "ag_tn" else rows
  outputs = [[np.frombuffer(b, BF16).reshape(y_rows, n) for b in s] for s in first]
  oracles = [[_oracle(op, xs[s], ws[s], r, tp, rows) for r in range(tp)] for s in range(sets)]
  return Loopback(outputs, oracles, list(mism), secs)
