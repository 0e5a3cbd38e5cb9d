"""Where the fused AG+GEMM loses time against our GEMM alone (a diagnostic, not the
benchmark: benchmarks/tp_sp.py is). Per shape, bf16, ms per call (harness.time_fn):
  gemm     ops.matmul on one GPU over the gathered rows (the floor)
  tp1      ag_tn fused on a 1-GPU group: Hopper builders, dynamic claims and the
           mapped epilogue, no gather
  tp2 m=N  ag_tn fused on 2 GPUs with N initial movers
  xla      all_gather + dot on 2 GPUs
Usage: python scripts/gpu_bench_ag.py [M K N ...]   (M total rows, K, N per rank)"""
import os
import pathlib
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "benchmarks"))
import harness  # noqa: E402

from kosmos_jax import ops  # noqa: E402
from kosmos_jax.ops._fused_tp import ag_tn_fused, builder_runs  # noqa: E402


def _sm(mesh, fn, ins):
  return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=ins, out_specs=P("tp", None, None)))


def main():
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  m2, m1 = jax.sharding.Mesh(np.array(gpus[:2]), ("tp",)), jax.sharding.Mesh(np.array(gpus[:1]), ("tp",))
  args = [int(a) for a in sys.argv[1:]] or [8192, 8192, 28672, 8192, 8192, 7168, 8192, 4096, 3072]
  print(f"{gpus[0].device_kind}; M total rows, K, N per rank; bf16; ms per call")
  for M, K, N in zip(args[0::3], args[1::3], args[2::3]):
    xh = jax.random.normal(jax.random.key(1), (1, M, K), jnp.bfloat16)
    wh = jax.random.normal(jax.random.key(2), (K, N), jnp.bfloat16) * 0.02
    x2 = jax.device_put(xh, NamedSharding(m2, P(None, "tp", None)))
    w2 = jax.device_put(wh, NamedSharding(m2, P()))
    x1, w1 = jax.device_put(xh, NamedSharding(m1, P())), jax.device_put(wh, NamedSharding(m1, P()))
    arms = {
        "gemm": (_sm(m1, lambda a, b: ops.matmul(a, b, layout="TN", impl="fused"), (P(), P())), (x1, w1)),
        "tp1": (_sm(m1, lambda a, b: ag_tn_fused(a, b, axis_name="tp"), (P(None, "tp", None), P())), (x1, w1)),
        "xla": (_sm(m2, lambda a, b: jax.lax.all_gather(a, "tp", axis=1, tiled=True) @ b,
                    (P(None, "tp", None), P())), (x2, w2)),
    }
    for mv in (1, 4, 16, 32):
      arms[f"tp2 m={mv}"] = (_sm(m2, lambda a, b, mv=mv: ag_tn_fused(a, b, axis_name="tp", movers=mv),
                                 (P(None, "tp", None), P())), (x2, w2))
    line = []
    for name, (f, ins) in arms.items():
      t = harness.time_fn(f, [ins], calls=10, reps=3)
      line.append(f"{name}={t.median_ms:.3f}")
    print(f"M={M} K={K} N={N}: " + "  ".join(line), flush=True)
  print("builder runs:", builder_runs())


if __name__ == "__main__":
  main()
