"""Output hashes of the fused kernels on fixed inputs, for an A/B of a kernel change
that must keep the bits (one GPU; the loopback hook runs every rank on it).

  python3 scripts/kernel_hashes.py OUT.json      # then diff two runs' files

Cases: ops.matmul TN/NN/NT (fused, all SMs); loopback ag_tn pull/push, tn_rs
pull/push/push_fold, ag_nn, bulk_ag_nn, bulk_rs_nt at tp 2/4/8 on a thin and a wide
shape, fixed seeds. Each line: case -> sha256 of every rank's output bytes in order.
"""
import hashlib
import json
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from kosmos_jax import ops  # noqa: E402
from kosmos_jax.testing import loopback  # noqa: E402

BF16 = jnp.bfloat16
# The loopback table's inputs per op (csrc/loopback.h), M = tp * rows.
IN_SHAPES = {
    "ag_tn": lambda tp, r, k, n: [(r, k), (k, n)], "tn_rs": lambda tp, r, k, n: [(tp * r, k), (k, n)],
    "ag_nn": lambda tp, r, k, n: [(r, n), (k, n)],
    "bulk_ag_nn": lambda tp, r, k, n: [(r, k), (tp * r, n), (k, n)],
    "bulk_rs_nt": lambda tp, r, k, n: [(tp * r, k), (tp * r, k), (tp * r, n)]}
ARMS = {"ag_tn": ["pull", "push"], "tn_rs": ["pull", "push", "push_fold"], "ag_nn": ["pull"],
        "bulk_ag_nn": ["pull"], "bulk_rs_nt": ["push"]}
# Each transport's key suffix, t0/t1/t2 as recorded before the transports were
# named: files from before and after compare key by key.
KEY = {"pull": "t0", "push": "t1", "push_fold": "t2"}
SHAPES = {"thin": (1024, 2048, 512), "wide": (512, 1024, 2048)}  # rows per rank, K, N


def _rand(rng, shape):
  return (rng.standard_normal(shape, np.float32) * 0.5).astype(BF16)


def main(path):
  out = {}
  sms = jax.devices()[0].core_count
  for layout in ("TN", "NN", "NT"):
    rng = np.random.default_rng(1)
    a = _rand(rng, (2048, 1024) if layout != "NT" else (1024, 2048))
    b = _rand(rng, {"TN": (1024, 1536), "NN": (1536, 1024), "NT": (1024, 1536)}[layout])
    y = np.asarray(jax.jit(lambda a, b: ops.matmul(a, b, layout=layout, impl="fused"))(a, b))
    out[f"matmul/{layout}"] = hashlib.sha256(y.tobytes()).hexdigest()
  for op, arms in ARMS.items():
    for tp in (2, 4, 8):
      for sname, (rows, k, n) in SHAPES.items():
        rng = np.random.default_rng(tp * 100 + len(op))
        ins = [[[_rand(rng, sh) for sh in IN_SHAPES[op](tp, rows, k, n)] for _ in range(tp)]]
        for transport in arms:
          first, mism, _ = loopback.run([op], tp, rows, k, n, ins, cu_cap=sms // tp, calls=2,
                                        transports=(transport,), stage_bf16=transport == "push_fold")
          h = hashlib.sha256(b"".join(first[0])).hexdigest()
          key = f"{op}/tp{tp}/{sname}/{KEY[transport]}"
          out[key] = h if not any(mism) else f"MOVED {list(mism)} {h}"
          print(op, tp, sname, transport, out[key][:16], flush=True)
  with open(path, "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "kernel_hashes.json")
