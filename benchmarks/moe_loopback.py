"""The MoE megakernels at EP > 1 as loopback ranks on one GPU (the cost view of issues
27 and 28: no byte crosses NVLink, every rank shares one GPU's SMs and HBM).

Per preset and EP size: ep ranks of `tokens` tokens each, balanced routing, no shared
expert, each rank a concurrent launch with its own heap (kosmos_jax.testing.loopback),
against the same ep * tokens tokens through one EP = 1 launch with every expert: the
same FLOPs and rows on the same GPU, so the ratio is what the EP protocol costs beyond
the layer itself (count exchange, pushes into peers' heaps, returned rows, the fold's
copies, ranks' CTAs split ep ways; the backward also pushes every pair's x row again).
Two arms each: the forward alone, and forward + backward launches (a training step's
two launches; the backward's time is their difference). Experts reduced as
benchmarks/moe.py reduces them.

  python3 benchmarks/moe_loopback.py --presets qwen3-30b-a3b --eps 2,8 --tokens 2048
Writes benchmarks/results/moe_loopback_h200.csv (or --out) and prints a table.
"""
from __future__ import annotations

import argparse
import csv
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from kosmos_jax import moe
from kosmos_jax.testing import loopback, moe_arena_rows, moe_return_rows

HERE = os.path.dirname(os.path.abspath(__file__))


def _balanced(rng, t, k, e):
  """indices [t, k]: every expert about t * k / e pairs, distinct per token."""
  idx = np.stack([(np.arange(k) + rng.integers(e)) % e for _ in range(t)]).astype(np.int32)
  return idx, rng.uniform(0.1, 1.0, (t, k)).astype(np.float32)


def _weights(rng, shape):
  """bf16 N(0, 0.02) weights [E, ...]: one expert drawn, the others its rows rotated
  (random-looking operands for the timing; drawing DeepSeek-V3's 128 experts outright
  took longer than a device call's limit)."""
  base = (rng.standard_normal(shape[1:], np.float32) * np.float32(0.02)).astype(jnp.bfloat16)
  return np.stack([np.roll(base, 7 * j, axis=0) for j in range(shape[0])])


def _inputs(rng, ranks, t, k, e, h, i):
  bf = lambda a: np.asarray(a, np.float32).astype(jnp.bfloat16)
  w1, w2 = _weights(rng, (e, h, 2 * i)), _weights(rng, (e, i, h))
  el = e // ranks
  out = []
  for r in range(ranks):
    idx, w = _balanced(rng, t, k, e)
    out.append([bf(rng.normal(0, 1, (t, h))), idx, w, w1[r * el:(r + 1) * el], w2[r * el:(r + 1) * el],
                bf(rng.normal(0, 1, (t, h)))])
  return [out]


def _ms(ops, ranks, t, k, e, h, i, ins, cap, calls, heap_mb):
  """ms per len(ops) launches (one forward, or a forward and its backward) on every rank."""
  kw = dict(cu_cap=cap, check=False, heap_mb=heap_mb, moe=(e, k, i, 0))
  loopback.run(ops, ranks, t, h, 0, ins, calls=3 * len(ops), **kw)  # warm-up
  _, _, sec = loopback.run(ops, ranks, t, h, 0, ins, calls=calls * len(ops), **kw)
  return 1e3 * sec / calls


STEP = ["moe_forward", "moe_backward"]


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--presets", default="qwen3-30b-a3b")
  ap.add_argument("--eps", default="2,8")
  ap.add_argument("--tokens", type=int, default=2048, help="tokens per rank")
  ap.add_argument("--max-experts", type=int, default=128, help="experts kept (per-expert shapes unchanged)")
  ap.add_argument("--calls", type=int, default=20)
  ap.add_argument("--out", default=os.path.join(HERE, "results", "moe_loopback_h200.csv"))
  args = ap.parse_args()
  sms = jax.devices("gpu")[0].core_count
  rows = []
  for name in args.presets.split(","):
    cfg = moe.PRESETS[name]
    e, k, h, i = min(cfg.num_experts, args.max_experts), cfg.top_k, cfg.hidden, cfg.expert_intermediate
    for ep in (int(v) for v in args.eps.split(",")):
      rng = np.random.default_rng(ep)
      t = args.tokens
      ins = _inputs(rng, ep, t, k, e, h, i)
      # The heap a rank needs (kernels/moe/fwd_heap.h): 16 MiB below the data region, then
      # its arena, returned rows and (the backward's) X arena; 64 MiB to spare.
      need = 16 + (2 * moe_arena_rows(t, k, e, ep) + moe_return_rows(t, k, e, ep)) * h * 2 // 2**20 + 64
      t0 = time.time()
      lb = [_ms(ops, ep, t, k, e, h, i, ins, sms // ep, args.calls, need) for ops in (STEP[:1], STEP)]
      # The same ep * t tokens with every expert, one EP = 1 launch on the whole GPU.
      one_in = [[[np.concatenate([r[j] for r in ins[0]]) for j in range(6)]]]
      one = [_ms(ops, 1, ep * t, k, e, h, i, one_in, sms, args.calls, 64) for ops in (STEP[:1], STEP)]
      flops = 2 * ep * t * k * h * 3 * i  # the forward's; the backward's is twice it
      rows.append(dict(preset=name, experts=e, ep=ep, tokens_per_rank=t, fwd_loopback_ms=round(lb[0], 4),
                       fwd_ep1_ms=round(one[0], 4), fwd_ratio=round(lb[0] / one[0], 4),
                       step_loopback_ms=round(lb[1], 4), step_ep1_ms=round(one[1], 4),
                       step_ratio=round(lb[1] / one[1], 4), bwd_ratio=round((lb[1] - lb[0]) / (one[1] - one[0]), 4),
                       ep1_step_tflops=round(3 * flops / one[1] / 1e9, 1), date=time.strftime("%Y-%m-%d"),
                       commit=os.environ.get("KOSMOS_COMMIT", "")))
      print(f"{name} E={e} ep={ep} t={t}/rank: forward loopback {lb[0]:.3f} ms vs EP=1 on {ep * t} tokens "
            f"{one[0]:.3f} ms ({lb[0] / one[0]:.3f}x); forward + backward {lb[1]:.3f} vs {one[1]:.3f} ms "
            f"({lb[1] / one[1]:.3f}x; backward {(lb[1] - lb[0]) / (one[1] - one[0]):.3f}x) "
            f"({time.time() - t0:.0f} s)", flush=True)
      _write(args.out, rows)  # after every row: a run cut short keeps what it measured


def _write(path, rows):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", newline="") as f:
    wr = csv.DictWriter(f, fieldnames=list(rows[0]))
    wr.writeheader()
    wr.writerows(rows)


if __name__ == "__main__":
  main()
