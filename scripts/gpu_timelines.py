"""Role timelines of the fused kernels (issue 6 deliverable 5, the paper's Figure 4):
one traced call of AG+GEMM and one of GEMM+RS on every local GPU (TP = all of them),
written as Chrome-trace JSON and PNG.

Needs the extension built with tracing:
  pip install --no-build-isolation -e . -Ccmake.define.KOSMOS_TRACE=ON
Usage: python scripts/gpu_timelines.py [--out-dir benchmarks/results] [--m 8192 --k 8192 --n 7168]
         [--kernels ag_tn,tn_rs] [--loopback TP --arm pull|push|push_fold[+crewN...]]
(ag_tn: M total rows, K, N per rank; tn_rs: the same M, K per rank = K, N = N).
--loopback TP: every rank a concurrent launch on GPU 0 with SMs // TP CTAs
(kosmos_jax/testing/loopback.py; knobs as benchmarks/loopback.py's --arms); the
timelines then show the roles without NVLink (a peer heap is GPU 0's memory)."""
import argparse
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

from kosmos_jax import ops, trace  # noqa: E402


def _problem(kernel, mesh, M, K, N):
  tp = mesh.size
  k1, k2 = jax.random.key(1), jax.random.key(2)
  if kernel == "ag_tn":
    x, w = jax.random.normal(k1, (M, K), jnp.bfloat16), jax.random.normal(k2, (K, N), jnp.bfloat16) * 0.02
    xs, ws, ys = P("tp", None), P(), P("tp", None)
  else:
    x, w = jax.random.normal(k1, (M, tp * K), jnp.bfloat16), jax.random.normal(k2, (tp * K, N), jnp.bfloat16) * 0.02
    xs, ws, ys = P(None, "tp"), P("tp", None), P("tp", None)
  op = getattr(ops, kernel)
  f = jax.jit(jax.shard_map(lambda a, b: op(a, b, axis_name="tp", impl="fused"), mesh=mesh, in_specs=(xs, ws),
                            out_specs=ys))
  return f, (jax.device_put(x, NamedSharding(mesh, xs)), jax.device_put(w, NamedSharding(mesh, ws)))


def _loopback_records(kernel, tp, M, K, N, arm):
  """(records, dropped, title suffix) of one loopback call of `kernel` at TP `tp`."""
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
  import loopback as bench
  from kosmos_jax.testing import loopback
  rows, rng = M // tp, np.random.default_rng(0)
  inputs = [[bench.loopback_inputs(kernel, rng, tp, rows, K, N) for _ in range(tp)]]
  cap = jax.devices()[0].core_count // tp
  recs, dropped = loopback.capture([kernel], tp, rows, K, N, inputs, cu_cap=cap,
                                    heap_mb=bench.heap_mb(kernel, tp, rows, K, N),
                                    **bench.arm_knobs(arm, kernel, K, N, cap, jax.devices()[0].core_count))
  return recs, dropped, f"loopback TP {tp} on one GPU ({cap} CTAs per rank), {arm}"


def _records(kernel, args, mesh):
  if args.loopback:
    return _loopback_records(kernel, args.loopback, args.m, args.k, args.n, args.arm)
  f, ins = _problem(kernel, mesh, args.m, args.k, args.n)
  for _ in range(3):
    jax.block_until_ready(f(*ins))  # compiled and warm: capture one steady-state call
  _, recs, dropped = trace.capture(f, *ins)
  return recs, dropped, f"TP {mesh.size}"


def _tile_phases(recs):
  """GEMM+RS Hopper builders' per-tile spans (kernels/tp/gemm_rs_sm90.cuh tile_phase), per rank:
  tiles, mean us of mainloop / retire+stage / combine / copy issue for the tiles that combine
  (push_fold's own chunk) and for the others, the run's span, and the fold's band waits."""
  lines = []
  for rank in np.unique(recs["rank"]):
    r = recs[(recs["rank"] == rank) & (recs["tile"] >= 0)]
    tiles, band_waits = {}, []
    for cta in np.unique(r["cta"]):
      c = r[r["cta"] == cta]
      c = c[np.argsort(c["start_ns"], kind="stable")]
      for rec in c:  # the phase spans of a tile chain end to start; a band wait lies inside its combine
        key = (int(cta), int(rec["tile"]))
        if rec["role"] == 0:
          tiles[key] = {"build": rec["end_ns"] - rec["start_ns"], "end": rec["end_ns"]}
        elif key in tiles and rec["start_ns"] == tiles[key]["end"]:
          tiles[key][trace.ROLE_NAMES[rec["role"]]] = rec["end_ns"] - rec["start_ns"]
          tiles[key]["end"] = rec["end_ns"]
        elif rec["role"] == 3:
          band_waits.append(rec["end_ns"] - rec["start_ns"])
    for kind, sel in (("combining", lambda d: "reduce" in d), ("other", lambda d: "reduce" not in d)):
      ds = [d for d in tiles.values() if sel(d)]
      if ds:
        mean = {k: np.mean([d.get(k, 0) for d in ds]) / 1e3 for k in ("build", "wait", "reduce", "idle")}
        lines.append(f"rank {rank} {kind:9s} tiles {len(ds):5d}: mean us mainloop {mean['build']:.2f} "
                     f"retire+stage {mean['wait']:.2f} combine {mean['reduce']:.2f} issue {mean['idle']:.2f}")
    lines.append(f"rank {rank}: run {(r['end_ns'].max() - r['start_ns'].min()) / 1e3:.1f} us, "
                 f"band waits {len(band_waits)} summing {sum(band_waits) / 1e3:.1f} us")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out-dir", default="benchmarks/results")
  ap.add_argument("--m", type=int, default=8192)
  ap.add_argument("--k", type=int, default=8192)
  ap.add_argument("--n", type=int, default=7168)
  ap.add_argument("--kernels", default="ag_tn,tn_rs")
  ap.add_argument("--loopback", type=int, default=0, help="TP ranks on GPU 0 (0: one rank per local GPU)")
  ap.add_argument("--arm", default="pull", help="loopback knobs: pull|push|push_fold (RS)[+fp32][+bandsN][+crewN]")
  args = ap.parse_args()
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  mesh = jax.sharding.Mesh(np.array(gpus), ("tp",))
  out = pathlib.Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  for kernel in args.kernels.split(","):
    recs, dropped, how = _records(kernel, args, mesh)
    tp = args.loopback or mesh.size
    tag = f"_loopback_{args.arm.replace('+', '_')}" if args.loopback else ""
    stem = out / f"timeline_{kernel}_tp{tp}{tag}"
    trace.write_chrome_trace(recs, f"{stem}.json")
    trace.plot_timeline(recs, f"{stem}.png", title=f"{kernel} M={args.m} K={args.k} N={args.n}, {how}, "
                        f"{gpus[0].device_kind}")
    roles = {trace.ROLE_NAMES[r]: int((recs["role"] == r).sum()) for r in np.unique(recs["role"])}
    print(f"{kernel}: {recs.size} records ({dropped} dropped), per role {roles} -> {stem}.png, {stem}.json")
    if kernel == "tn_rs":
      print(_tile_phases(recs))
    if os.environ.get("OUT"):
      for ext in ("png", "json"):
        (pathlib.Path(os.environ["OUT"]) / f"{stem.name}.{ext}").write_bytes(pathlib.Path(f"{stem}.{ext}").read_bytes())


if __name__ == "__main__":
  main()
