"""One process of the multi-process (one GPU per process, jax.distributed) test of
fused GEMM+RS: heaps are exchanged as CUDA IPC handles through JAX's key-value
store. Usage: python mp_tn_rs_worker.py PROCESS_ID NUM_PROCESSES PORT"""
import sys

import mp_common  # noqa: I001  (before jax: sets the environment)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

# Row-parallel layout: x [B, m, K] and w [K, n] split along K; device r keeps rows
# r*m/tp.. of the sum, so out_specs splits the rows.
X_SPEC, W_SPEC, Y_SPEC = P(None, None, "tp"), P("tp", None), P(None, "tp", None)
SHAPES = [((2, 384, 320), 200),  # batch 2: the rank-major transpose; 192 rows per rank, not a tile multiple
          ((1, 512, 256), 136)]  # batch 1: a free reshape; 136 columns, not a tile multiple
CONFIGS = [  # (dtype, fused kwargs): the RsConfig fields of ops.tn_rs(impl="fused", config=...)
    (jnp.bfloat16, {}),
    (jnp.bfloat16, dict(cu_cap=1)),
    (jnp.bfloat16, dict(reducers=0)),
    (np.float32, dict(cu_cap=7)),
    (jnp.bfloat16, dict(transport="push")),
    (jnp.bfloat16, dict(transport="push", cu_cap=1)),
    (jnp.bfloat16, dict(transport="push_fold")),
    (jnp.bfloat16, dict(transport="push_fold", cu_cap=1)),
]
CALLS = 4  # back-to-back calls per config and round, one sync at the end


def _rel(got, want):
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def main():
  pid, mesh = mp_common.start(sys.argv)
  from kosmos_jax import RsConfig, ops, reference

  rng = np.random.default_rng(11)  # same global inputs in every process

  def glob(a, spec):
    return mp_common.glob(mesh, a, spec)

  jitted = {}  # one executable per (kind, kwargs): repeated calls reuse it

  def call(kind, kw, x, w):
    key = (kind, tuple(sorted(kw.items())))
    if key not in jitted:
      if kind == "fused" and ("reducers" in kw or "transport" in kw):
        fn = lambda a, b: ops.tn_rs(a, b, axis_name="tp", impl="fused", config=RsConfig(**kw))  # noqa: E731
      elif kind == "fused":
        fn = lambda a, b: ops.tn_rs(a, b, axis_name="tp", impl="fused", **kw)  # noqa: E731
      else:
        fn = lambda a, b: reference.tn_rs(a, b, axis_name="tp")  # noqa: E731
      jitted[key] = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(X_SPEC, W_SPEC), out_specs=Y_SPEC))
    return jitted[key](glob(x, X_SPEC), glob(w, W_SPEC))

  def twin(x, w):
    with jax.default_matmul_precision("highest"):  # XLA's GPU default for f32 is TF32
      return call("twin", {}, x, w)

  def local(y):
    """(this process's rows as float64, their index into the global result)."""
    shard = y.addressable_shards[0]
    return np.asarray(shard.data, np.float64), shard.index

  def draw(shape, n, dtype):
    k = shape[-1]
    return (rng.standard_normal(shape).astype(dtype), (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype))

  # A mesh of this process's GPU alone: its size-1 group has its own control slot
  # (claimed through the KV store), and each process calls it a different number
  # of times between the pair calls, so per-device epochs would drift apart.
  solo = jax.sharding.Mesh(np.array(jax.local_devices()[:1]), ("tp",))
  solo_f = jax.jit(jax.shard_map(lambda a, b: ops.tn_rs(a, b, axis_name="tp", impl="fused"), mesh=solo,
                                 in_specs=(X_SPEC, W_SPEC), out_specs=Y_SPEC))
  solo_rng = np.random.default_rng(200 + pid)  # own stream: `rng` must stay in step across processes

  worst = 0.0
  for it in range(4):
    for _ in range((it + pid) % 3):
      xs = solo_rng.standard_normal((1, 128, 64)).astype(np.float32)
      ws = (solo_rng.standard_normal((64, 48)) / 8).astype(np.float32)
      got = np.asarray(solo_f(jax.device_put(xs, NamedSharding(solo, X_SPEC)),
                              jax.device_put(ws, NamedSharding(solo, W_SPEC))), np.float64)
      want = xs.astype(np.float64) @ ws
      err = _rel(got, want)
      assert err <= 1e-5, f"process {pid} round {it} solo call: rel err {err:.3e}"
    shape, n = SHAPES[it % len(SHAPES)]
    # Push (and push_fold) needs the Hopper builders: whole 128-row tiles per rank (every process skips alike).
    hopper = (shape[-2] // mesh.size) % 128 == 0
    for dtype, kw in CONFIGS:
      if kw.get("transport", "pull") != "pull" and not hopper:
        continue
      what = f"process {pid} round {it} {np.dtype(dtype)} {kw} {shape}x{n}"
      ins = [draw(shape, n, dtype) for _ in range(CALLS)]  # fresh inputs every call
      ys = [call("fused", kw, x, w) for x, w in ins]  # back to back, no sync between
      again = call("fused", kw, *ins[0])  # the first input once more, after the others
      refs = [twin(x, w) for x, w in ins]
      bound = 1e-5 if dtype == np.float32 else 1e-2
      for i, ((x, w), y, ref) in enumerate(zip(ins, ys, refs)):
        assert y.shape == ref.shape == (*shape[:-1], n), (what, y.shape, ref.shape)
        assert y.dtype == jnp.dtype(dtype), (what, y.dtype)
        got, idx = local(y)
        assert np.all(np.isfinite(got)), f"{what} call {i}: NaN in output (unwritten element?)"
        oracle = (np.asarray(x, np.float64) @ np.asarray(w, np.float64))[idx]
        err = max(_rel(got, oracle), _rel(got, local(ref)[0]))
        assert err <= bound, f"{what} call {i}: rel err {err:.3e} > {bound}"
        worst = max(worst, err / bound)
      first = np.asarray(ys[0].addressable_shards[0].data)
      second = np.asarray(again.addressable_shards[0].data)
      assert first.tobytes() == second.tobytes(), (
          f"{what}: two runs of one input differ in {np.count_nonzero(first != second)} elements")

    # Fixed-order fp32 sums rounded once: the bits depend on the data alone, not on
    # the grid, the reducer count or the run.
    x, w = draw(shape, n, jnp.bfloat16)
    runs = [np.asarray(call("fused", kw, x, w).addressable_shards[0].data).view(np.uint16)
            for kw in ({}, dict(cu_cap=1), dict(reducers=0), dict(cu_cap=7, reducers=3), {},
                       *((dict(transport="push"), dict(transport="push", cu_cap=1), dict(transport="push_fold"),
                          dict(transport="push_fold", cu_cap=1)) if hopper else ()))]
    for j, r in enumerate(runs[1:], 1):
      assert np.array_equal(runs[0], r), (
          f"process {pid} round {it}: bitwise run {j} differs in {np.count_nonzero(runs[0] != r)} elements")
  print(f"MP_OK process {pid}: worst err/bound {worst:.3f}", flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
