"""Quick timing of fused AG+GEMM (portable SIMT engine) vs XLA's all-gather + dot,
tp = all local GPUs, bf16. Not the benchmark harness (benchmarks/): a sanity number
for the first kernel. Usage: python scripts/gpu_bench_ag.py [M K N ...]"""
import os
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from kosmos_jax import reference  # noqa: E402
from kosmos_jax.ops._fused_tp import ag_tn_fused  # noqa: E402


def bench(f, args, reps=20):
  jax.block_until_ready(f(*args))
  t = []
  for _ in range(3):
    t0 = time.perf_counter()
    for _ in range(reps):
      out = f(*args)
    jax.block_until_ready(out)
    t.append((time.perf_counter() - t0) / reps)
  return float(np.median(t))


def main():
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  tp = len(gpus)
  mesh = jax.sharding.Mesh(np.array(gpus), ("tp",))
  shapes = [tuple(map(int, sys.argv[i:i + 3])) for i in range(1, len(sys.argv), 3)] or [(8192, 4096, 4096), (4096, 8192, 2048)]
  print(f"tp={tp} {gpus[0].device_kind}; M total rows, K, N per rank; bf16; ms per call (median of 3x20)")
  print("   M     K     N | xla AG+dot | dot only | fused | fused cap66 | fused TFLOP/s")
  for M, K, N in shapes:
    x = jax.device_put(jax.random.normal(jax.random.key(1), (1, M, K), jnp.bfloat16), NamedSharding(mesh, P(None, "tp", None)))
    w = jax.device_put(jax.random.normal(jax.random.key(2), (K, N), jnp.bfloat16) * 0.02, NamedSharding(mesh, P()))
    xg = jax.device_put(x, NamedSharding(mesh, P()))
    sm = lambda fn, ins: jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=ins, out_specs=P("tp", None, None)))
    spec = (P(None, "tp", None), P())
    ref = sm(lambda a, b: reference.ag_tn(a, b, axis_name="tp"), spec)
    dot = sm(lambda a, b: jnp.einsum("bmk,kn->bmn", a, b, preferred_element_type=jnp.float32).astype(a.dtype), (P(), P()))
    fz = sm(lambda a, b: ag_tn_fused(a, b, axis_name="tp"), spec)
    fc = sm(lambda a, b: ag_tn_fused(a, b, axis_name="tp", cu_cap=66), spec)
    t_ref, t_dot, t_f, t_c = bench(ref, (x, w)), bench(dot, (xg, w)), bench(fz, (x, w)), bench(fc, (x, w))
    err = float(jnp.linalg.norm((fz(x, w) - ref(x, w)).astype(jnp.float32)) / jnp.linalg.norm(ref(x, w).astype(jnp.float32)))
    print(f"{M:5d} {K:5d} {N:5d} | {t_ref*1e3:10.3f} | {t_dot*1e3:8.3f} | {t_f*1e3:5.3f} | {t_c*1e3:11.3f} | "
          f"{2*M*K*N/t_f/1e12:6.1f}  (rel err vs xla {err:.1e})")


if __name__ == "__main__":
  main()
