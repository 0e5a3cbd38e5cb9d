"""Where the fused TP+SP kernels lose time against our GEMM alone (a diagnostic, not
the benchmark: benchmarks/tp_sp.py is). Per shape, bf16, ms per call (harness.time_fn):
  gemm      ops.matmul on one GPU, the rank's whole GEMM (the floor)
  tp1       the fused op on a 1-GPU group: Hopper builders, dynamic claims, the mapped
            epilogue (and for tn_rs the staging + a one-rank reduction), no transport
  tp2 c=N   the fused op on 2 GPUs with N CTAs in the initial comm crew
  xla       XLA's collective + dot on 2 GPUs
Usage: python scripts/gpu_bench_fused.py ag_tn|tn_rs [--only ARM] [--crews 8,16] [--bands 1,8]
       [--transport pull|push] [M K N ...]
(M total rows; ag_tn: K, N per rank; tn_rs: K per rank, N; --help for the options)"""
import argparse
import os
import pathlib
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# The paper's largest shapes stage or gather GiBs per rank (the default heap is 1 GiB).
os.environ.setdefault("KOSMOS_HEAP_MB", "16384")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "benchmarks"))
import harness  # noqa: E402

from kosmos_jax import AgConfig, RsConfig, ops  # noqa: E402
from kosmos_jax.testing import builder_runs  # noqa: E402

DEFAULT = {"ag_tn": [8192, 8192, 7168, 8192, 4096, 3072], "tn_rs": [8192, 3584, 8192, 8192, 512, 4096]}


def _time(f, ins):
  return harness.time_fn(f, [ins], calls=10, reps=3).median_ms


def _arms(kernel, M, K, N, m1, m2, crews=(0, 8, 16, 32), bands=(), transport="pull"):
  """name -> (jitted fn, inputs) for one shape; the tp2 arms use `transport`."""
  key1, key2 = jax.random.key(1), jax.random.key(2)
  sm = lambda mesh, fn, ins, out: jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=ins, out_specs=out))
  put = lambda a, mesh, spec: jax.device_put(a, NamedSharding(mesh, spec))
  if kernel == "ag_tn":
    x, w = jax.random.normal(key1, (M, K), jnp.bfloat16), jax.random.normal(key2, (K, N), jnp.bfloat16) * 0.02
    xs, ws, ys, cfg = P("tp", None), P(), P("tp", None), AgConfig
    xla = lambda a, b: jax.lax.all_gather(a, "tp", axis=0, tiled=True) @ b
  else:  # x [M, tp*K], w [tp*K, N]: rank r holds K columns of x and K rows of w
    x, w = jax.random.normal(key1, (M, 2 * K), jnp.bfloat16), jax.random.normal(key2, (2 * K, N), jnp.bfloat16) * 0.02
    xs, ws, ys, cfg = P(None, "tp"), P("tp", None), P("tp", None), RsConfig
    xla = lambda a, b: jax.lax.psum_scatter(a @ b, "tp", scatter_dimension=0, tiled=True)
  fused = getattr(ops, kernel)
  op = lambda a, b, axis_name, **kw: fused(a, b, axis_name=axis_name, impl="fused",  # noqa: E731
                                           config=cfg(transport=transport, **kw))
  x1, w1 = put(x[:, :K] if kernel == "tn_rs" else x, m1, P()), put(w[:K] if kernel == "tn_rs" else w, m1, P())
  x2, w2 = put(x, m2, xs), put(w, m2, ws)
  arms = {
      "gemm": (sm(m1, lambda a, b: ops.matmul(a, b, layout="TN", impl="fused"), (P(), P()), P()), (x1, w1)),
      "tp1": (sm(m1, lambda a, b: op(a, b, axis_name="tp"), (P(), P()), P()), (x1, w1)),
      "xla": (sm(m2, xla, (xs, ws), ys), (x2, w2)),
  }
  knob = "movers" if kernel == "ag_tn" else "reducers"
  if kernel == "tn_rs":
    arms["tp2 fp32-stage"] = (sm(m2, lambda a, b: op(a, b, axis_name="tp", stage="fp32"), (xs, ws), ys), (x2, w2))
  for c in crews:
    arms[f"tp2 c={c}"] = (sm(m2, lambda a, b, c=c: op(a, b, axis_name="tp", **{knob: c}), (xs, ws), ys), (x2, w2))
  for r in bands if kernel == "tn_rs" else ():
    arms[f"tp2 bands={r}"] = (sm(m2, lambda a, b, r=r: op(a, b, axis_name="tp", band_rows=r), (xs, ws), ys), (x2, w2))
  return arms


def main():
  ints = lambda v: tuple(int(c) for c in v.split(",") if c)
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("kernel", nargs="?", default="ag_tn", choices=sorted(DEFAULT))
  ap.add_argument("shape", nargs="*", type=int, help="M K N triples (default: two shapes per kernel)")
  ap.add_argument("--only", help="time just this arm (e.g. under ncu)")
  ap.add_argument("--crews", type=ints, default=(0, 8, 16, 32), help="the tp2 crews timed")
  ap.add_argument("--bands", type=ints, default=(), help="tn_rs: one more tp2 arm per band height")
  ap.add_argument("--transport", default="pull", choices=("pull", "push"), help="the fused arms' transport")
  a = ap.parse_intermixed_args()
  if len(a.shape) % 3:
    ap.error(f"shape: {len(a.shape)} integers is not a list of M K N triples")
  kernel, only, args = a.kernel, a.only, a.shape or DEFAULT[a.kernel]
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  m2, m1 = jax.sharding.Mesh(np.array(gpus[:2]), ("tp",)), jax.sharding.Mesh(np.array(gpus[:1]), ("tp",))
  print(f"{kernel} on {gpus[0].device_kind}; bf16; ms per call; transport {a.transport}")
  for M, K, N in zip(args[0::3], args[1::3], args[2::3]):
    arms = _arms(kernel, M, K, N, m1, m2, a.crews, a.bands, a.transport)
    line = [f"{name}={_time(f, ins):.3f}" for name, (f, ins) in arms.items() if only in (None, name)]
    print(f"M={M} K={K} N={N}: " + "  ".join(line), flush=True)
  print("builder runs:", builder_runs())


if __name__ == "__main__":
  main()
