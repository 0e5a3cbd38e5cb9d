"""Test data and oracles for the loopback hook (kosmos_jax/testing/loopback.py: a
fused call's ranks as concurrent launches on one GPU).

run() builds `sets` input sets of fresh random bf16 data and runs `calls`
calls with NaN-poisoned outputs: call i runs ops[i % len(ops)] on set
(i // len(ops)) % sets with transport transports[i % len(transports)] (names:
"pull", "push", "push_fold"), so consecutive calls never see the same inputs,
and a mixed ops list shares each rank's heap between the kernels. Input j of a set is one random array as long as the longest op's
input j; each op reads its own prefix of it (csrc/loopback.h), so ag_tn reads
the first rows of a tn_rs x. It returns the first outputs of every (set, op)
pair, the float64 oracle of each, and how many 16-bit words of every later call
differed from the first call of its pair (bitwise reproducibility and no stale
data)."""
import dataclasses

import jax.numpy as jnp
import numpy as np

from kosmos_jax.testing import loopback as _loopback

BF16 = jnp.bfloat16


def in_shapes(op, tp, rows, k, n):
  M = tp * rows
  return {"ag_tn": [(rows, k), (k, n)], "tn_rs": [(M, k), (k, n)], "ag_nn": [(rows, n), (k, n)],
          "bulk_ag_nn": [(rows, k), (M, n), (k, n)], "bulk_rs_nt": [(M, k), (M, k), (M, n)]}[op]


def out_shapes(op, tp, rows, k, n):
  M = tp * rows
  return {"ag_tn": [(M, n)], "tn_rs": [(rows, n)], "ag_nn": [(M, k), (M, n)],
          "bulk_ag_nn": [(M, k), (M, k)], "bulk_rs_nt": [(rows, k), (k, n)]}[op]


# Outputs that are copies of inputs (gathers): they must match bit for bit.
EXACT = {("ag_nn", 1), ("bulk_ag_nn", 0)}


def gather(shards, m_local):
  """all_gather_rows of rank shards [B * m_local, w]: batch-major, then rank."""
  w = shards[0].shape[-1]
  return np.stack([s.reshape(-1, m_local, w) for s in shards], axis=1).reshape(-1, w)


def _oracle(op, ins, rank, tp, rows, m_local):
  """Rank `rank`'s outputs in float64; ins[q] = rank q's inputs (this op's views)."""
  f = lambda a: np.asarray(a, np.float32).astype(np.float64)
  me = ins[rank]
  if op == "ag_tn":  # AG(x) @ w_r
    return [gather([f(i[0]) for i in ins], m_local) @ f(me[1])]
  if op == "tn_rs":  # sum_q (x_q @ w_q)[rows of chunk r]
    return [sum(f(ins[q][0][rank * rows:(rank + 1) * rows]) @ f(ins[q][1]) for q in range(tp))]
  if op == "ag_nn":  # dX_r = AG(dy) @ w_r.T, and AG(dy)
    g = gather([f(i[0]) for i in ins], m_local)
    return [g @ f(me[1]).T, g]
  if op == "bulk_ag_nn":  # AG(x), dy_r @ w_r.T
    return [gather([f(i[0]) for i in ins], m_local), f(me[1]) @ f(me[2]).T]
  # bulk_rs_nt: RS(dxp)_r summed in rank order, xg_r.T @ dy_r
  return [sum(f(ins[q][0][rank * rows:(rank + 1) * rows]) for q in range(tp)), f(me[1]).T @ f(me[2])]


def _views(op, flat, tp, rows, k, n):
  """This op's inputs: prefixes of the set's flat arrays, reshaped."""
  return [flat[j][:int(np.prod(sh))].reshape(sh) for j, sh in enumerate(in_shapes(op, tp, rows, k, n))]


@dataclasses.dataclass
class Loopback:
  outputs: dict     # (set, op) -> [rank] list of np.ndarray bf16 (the op's outputs): the pair's first call
  oracles: dict     # (set, op) -> [rank] list of np.ndarray float64
  mismatches: list  # per call: differing 16-bit words against its set's first call
  seconds: float


def run(ops, tp, rows, k, n, *, cu_cap, calls, sets=2, transports=("pull",), knob=-1, switching=True,
        stage_bf16=False, band_rows=1, heap_mb=256, seed=0, ordinal=0, m_local=0) -> Loopback:
  """ops: an op name (csrc/loopback.h's table) or a list of them run in turn;
  m_local: AG ops' rows per batch (0: one batch of `rows`)."""
  ops = [ops] if isinstance(ops, str) else list(ops)
  rng = np.random.default_rng(seed)
  sizes = [max(int(np.prod(sh)) for op in ops for j2, sh in enumerate(in_shapes(op, tp, rows, k, n)) if j2 == j)
           for j in range(max(len(in_shapes(op, tp, rows, k, n)) for op in ops))]
  flat = [[[(rng.standard_normal(size, np.float32) * 0.5).astype(BF16) for size in sizes] for _ in range(tp)]
          for _ in range(sets)]
  first, mism, secs = _loopback.run(ops, tp, rows, k, n, flat, cu_cap=cu_cap, calls=calls, transports=transports,
                                    knob=knob, switching=switching, stage_bf16=stage_bf16, band_rows=band_rows,
                                    heap_mb=heap_mb, ordinal=ordinal, m_local=m_local)
  outputs, oracles = {}, {}
  for c, ys in enumerate(first):  # call c < sets * len(ops) is the first of its (set, op) pair
    op, s = ops[c % len(ops)], c // len(ops)
    shapes = out_shapes(op, tp, rows, k, n)
    split = np.cumsum([int(np.prod(sh)) for sh in shapes])[:-1]
    outputs[s, op] = [[a.reshape(sh) for a, sh in zip(np.split(np.frombuffer(b, BF16), split), shapes)]
                      for b in ys]
    ins = [_views(op, flat[s][q], tp, rows, k, n) for q in range(tp)]
    oracles[s, op] = [_oracle(op, ins, r, tp, rows, m_local or rows) for r in range(tp)]
  return Loopback(outputs, oracles, list(mism), secs)
