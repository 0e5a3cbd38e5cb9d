"""Test data and oracles for the loopback hook (kosmos_jax/_loopback.py: a fused
call's ranks as concurrent launches on one GPU).

run() builds `sets` input sets of fresh random bf16 data and runs `calls`
calls with NaN-poisoned outputs: call i runs ops[i % len(ops)] on set
(i // len(ops)) % sets with transport push[i % len(push)], so consecutive calls
never see the same inputs, and a mixed ops list shares each rank's heap between
the two kernels. It returns the first output of every (set, op) pair, the
float64 oracle of each, and how many 16-bit words of every later call differed
from the first call of its pair (bitwise reproducibility and no stale data)."""
import dataclasses

import jax.numpy as jnp
import numpy as np

from kosmos_jax import _loopback

BF16 = jnp.bfloat16


@dataclasses.dataclass
class Loopback:
  outputs: dict     # (set, op) -> [rank] np.ndarray bf16: the pair's first call
  oracles: dict     # (set, op) -> [rank] np.ndarray float64
  mismatches: list  # per call: differing 16-bit words against its set's first call
  seconds: float


def _oracle(op, xs, ws, rank, tp, rows):
  f64 = lambda a: np.asarray(a, np.float32).astype(np.float64)
  if op == "ag_tn":  # y_r = [x_0; ...; x_{tp-1}] @ w_r, x_q the first `rows` rows of rank q's x
    return np.concatenate([f64(x[:rows]) for x in xs]) @ f64(ws[rank])
  # y_r = sum_q (x_q @ w_q)[rows of chunk r]
  return sum(f64(xs[q][rank * rows:(rank + 1) * rows]) @ f64(ws[q]) for q in range(tp))


def run(ops, tp, rows, k, n, *, cu_cap, calls, sets=2, push=(0,), knob=-1, switching=True, stage_bf16=False,
        band_rows=1, heap_mb=256, seed=0, ordinal=0) -> Loopback:
  """ops: "ag_tn", "tn_rs" or a list of them run in turn."""
  ops = [ops] if isinstance(ops, str) else list(ops)
  rng = np.random.default_rng(seed)
  x_rows = tp * rows if "tn_rs" in ops else rows
  xs = [[rng.standard_normal((x_rows, k), np.float32).astype(BF16) for _ in range(tp)] for _ in range(sets)]
  ws = [[(rng.standard_normal((k, n), np.float32) / np.sqrt(k)).astype(BF16) for _ in range(tp)]
        for _ in range(sets)]
  first, mism, secs = _loopback.run(ops, tp, rows, k, n, xs, ws, cu_cap=cu_cap, calls=calls, push=push, knob=knob,
                                    switching=switching, stage_bf16=stage_bf16, band_rows=band_rows,
                                    heap_mb=heap_mb, ordinal=ordinal)
  outputs, oracles = {}, {}
  for c, ys in enumerate(first):  # call c < sets * len(ops) is the first of its (set, op) pair
    op, s = ops[c % len(ops)], c // len(ops)
    y_rows = tp * rows if op == "ag_tn" else rows
    outputs[s, op] = [np.frombuffer(b, BF16).reshape(y_rows, n) for b in ys]
    oracles[s, op] = [_oracle(op, xs[s], ws[s], r, tp, rows) for r in range(tp)]
  return Loopback(outputs, oracles, list(mism), secs)
