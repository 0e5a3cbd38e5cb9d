"""One process of the multi-process (one GPU per process, jax.distributed) test of
fused AG+GEMM: heaps are exchanged as CUDA IPC handles through JAX's key-value
store. Usage: python mp_ag_tn_worker.py PROCESS_ID NUM_PROCESSES PORT"""
import sys

import mp_common  # noqa: I001  (before jax: sets the environment)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402


def main():
  pid, mesh = mp_common.start(sys.argv)
  from kosmos_jax import AgConfig, ops, reference

  rng = np.random.default_rng(7)  # same global inputs in every process

  def glob(a, spec):
    return mp_common.glob(mesh, a, spec)

  # Each device returns the whole product; out_specs stacks the copies, so this
  # process's addressable shard is its own device's result.
  def run(fn, x, w):
    f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P(None, "tp", None), P()), out_specs=P("tp", None, None)))
    return f(glob(x, P(None, "tp", None)), glob(w, P()))

  # A mesh of this process's GPU alone: its size-1 group has its own control slot
  # (claimed through the KV store), and each process calls it a different number
  # of times between the pair calls, so per-device epochs would drift apart.
  solo = jax.sharding.Mesh(np.array(jax.local_devices()[:1]), ("tp",))
  solo_f = jax.jit(jax.shard_map(lambda a, b: ops.ag_tn(a, b, axis_name="tp", impl="fused"), mesh=solo,
                                 in_specs=(P(None, "tp", None), P()), out_specs=P("tp", None, None)))

  solo_rng = np.random.default_rng(100 + pid)  # own stream: `rng` must stay in step across processes
  worst = 0.0
  for it in range(6):
    for _ in range((it + pid) % 3):
      xs = solo_rng.standard_normal((1, 128, 64)).astype(np.float32)
      ws = (solo_rng.standard_normal((64, 48)) / 8).astype(np.float32)
      got = np.asarray(solo_f(jax.device_put(xs, NamedSharding(solo, P(None, "tp", None))),
                              jax.device_put(ws, NamedSharding(solo, P()))), np.float64)
      want = xs.astype(np.float64) @ ws
      err = np.linalg.norm(got - want) / np.linalg.norm(want)
      assert err <= 1e-5, f"process {pid} iter {it} solo call: rel err {err:.3e}"
    for dtype, kw in ((np.float32, {}), (jnp.bfloat16, dict(cu_cap=1)), (jnp.bfloat16, dict(movers=0)),
                      (jnp.bfloat16, dict(transport="push")), (jnp.bfloat16, dict(transport="push", cu_cap=1))):
      x = rng.standard_normal((2, 384, 160)).astype(dtype)
      w = (rng.standard_normal((160, 200)) / 12).astype(dtype)
      y = run(lambda a, b: ops.ag_tn(a, b, axis_name="tp", impl="fused", config=AgConfig(**kw)), x, w)
      with jax.default_matmul_precision("highest"):  # XLA's GPU default for f32 is TF32
        ref = run(lambda a, b: reference.ag_tn(a, b, axis_name="tp"), x, w)
      oracle = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
      got = np.asarray(y.addressable_shards[0].data, np.float64)
      twin = np.asarray(ref.addressable_shards[0].data, np.float64)
      assert np.all(np.isfinite(got)), "NaN in output (unwritten element?)"
      err = max(np.linalg.norm(got - oracle) / np.linalg.norm(oracle),
                np.linalg.norm(got - twin) / np.linalg.norm(twin))
      bound = 1e-5 if dtype == np.float32 else 1e-2
      assert err <= bound, f"process {pid} iter {it} {np.dtype(dtype)} {kw}: rel err {err:.3e} > {bound}"
      worst = max(worst, err / bound)
  print(f"MP_OK process {pid}: worst err/bound {worst:.3f}", flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
