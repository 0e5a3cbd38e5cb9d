"""Fused ag_tn -> tn_rs under XLA command buffers (CUDA graphs), replayed many times.

XLA:GPU records runs of thunks into CUDA graphs and replays them on later
executions (`--xla_gpu_enable_command_buffer`, `--xla_gpu_graph_min_graph_size`).
The kosmos FFI handlers are not marked command-buffer compatible, so XLA keeps
the kernels themselves as separate thunks between the captured segments; what
must hold is that epochs, advanced on the device by the kernels (DESIGN.md §4),
stay in step however often the surrounding graphs and executables replay.

The flags must be set before JAX initialises its backends, so each check runs in
a subprocess (this file, run as `python test_graph_replay.py --worker DTYPE`):
a Megatron-style block y = tn_rs(tanh(ag_tn(x, w1)), w2) + x inside shard_map
over 2 GPUs, (a) as 50 steps of one jitted lax.scan, executed three times
(inputs A, B, then A again: bitwise equal to the first), and (b) as 50 separate
dispatches of one jitted step, with a repeat of the first at the end. Every step
uses fresh inputs, poisoned outputs, and is checked against the reference twin
and a float64 oracle.
"""
import os
import subprocess
import sys

import pytest

GRAPH_FLAGS = ("--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL "
               "--xla_gpu_graph_min_graph_size=1")
STEPS = 50
M, K, H = 320, 192, 256  # global rows (160 per rank: not a tile multiple), model width, hidden width


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_block_survives_graph_replay(dtype):
  import jax
  n = len([d for d in jax.devices() if d.platform == "gpu"])
  if n < 2:
    pytest.skip(f"needs 2 GPUs, found {n}")
  env = dict(os.environ, JAX_PLATFORMS="cuda", XLA_FLAGS=GRAPH_FLAGS, KOSMOS_POISON_OUTPUT="1",
             XLA_PYTHON_CLIENT_MEM_FRACTION="0.3")
  try:
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", dtype], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
  except subprocess.TimeoutExpired as e:
    pytest.fail(f"graph-replay worker timed out:\n{(e.stdout or '')[-6000:]}")
  assert p.returncode == 0 and f"GRAPH_OK {dtype}" in p.stdout, f"rc={p.returncode}:\n{p.stdout[-6000:]}"
  print(p.stdout.strip().splitlines()[-1])


# ---- the worker (a fresh process: XLA_FLAGS apply) ------------------------------

def _worker(dtype_name):
  os.environ.setdefault("XLA_FLAGS", GRAPH_FLAGS)
  os.environ.setdefault("KOSMOS_POISON_OUTPUT", "1")
  os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
  os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: helpers
  import jax
  import jax.numpy as jnp
  import numpy as np

  from kosmos_jax import ops, runtime
  from helpers import P, assert_close, fresh, put, shard_map

  dtype = jnp.dtype(dtype_name)
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  assert len(gpus) >= 2, f"needs 2 GPUs, found {len(gpus)}"
  mesh = jax.sharding.Mesh(np.array(gpus[:2]), ("tp",))
  assert runtime.init()["mode"] == "peer"

  X, W1, W2 = P(None, "tp", None), P(None, "tp"), P("tp", None)  # x rows; w1 columns; w2 rows

  def block(impl, x, w1, w2):  # per device: x [1, m/tp, k], w1 [k, h/tp], w2 [h/tp, k]
    h = jnp.tanh(ops.ag_tn(x, w1, axis_name="tp", impl=impl))  # [1, m, h/tp]
    return ops.tn_rs(h, w2, axis_name="tp", impl=impl) + x  # [1, m/tp, k]

  def scan_of(impl):
    def body(xs, w1s, w2s):
      return jax.lax.scan(lambda c, a: (c, block(impl, *a)), None, (xs, w1s, w2s))[1]
    return shard_map(body, mesh, in_specs=(P(None, *X), P(None, *W1), P(None, *W2)), out_specs=P(None, *X))

  def step_of(impl):
    return shard_map(lambda *a: block(impl, *a), mesh, in_specs=(X, W1, W2), out_specs=X)

  def oracle(x, w1, w2):
    x, w1, w2 = (np.asarray(a, np.float64) for a in (x, w1, w2))
    return np.tanh(x @ w1) @ w2 + x

  def draw(lead=()):
    return (fresh((*lead, 1, M, K), dtype), fresh((*lead, K, H), dtype, scale=K ** -0.5),
            fresh((*lead, H, K), dtype, scale=H ** -0.5))

  def twin(f, *args):
    with jax.default_matmul_precision("highest"):  # XLA's GPU default for f32 is TF32
      return f(*args)

  def graphs(f, *args):
    return f.lower(*args).compile().as_text().count("command_buffer")

  def host(arrays):  # device -> numpy once, then index on the host
    return [np.asarray(a) for a in arrays]

  def check(y, ref, x, w1, w2, what):
    assert y.shape == ref.shape == x.shape and y.dtype == dtype, (what, y.shape, ref.shape, y.dtype)
    assert_close(y, ref, dtype, what=f"{what}: fused vs twin")
    assert_close(y, oracle(x, w1, w2), dtype, what=f"{what}: fused vs oracle")

  # (a) one executable with 50 steps, executed three times.
  fused, ref = scan_of("fused"), scan_of("reference")
  ins = [draw((STEPS,)), draw((STEPS,))]
  args = [(put(x, mesh, P(None, *X)), put(w1, mesh, P(None, *W1)), put(w2, mesh, P(None, *W2))) for x, w1, w2 in ins]
  n_scan = graphs(fused, *args[0])
  ys = [fused(*args[0]), fused(*args[1]), fused(*args[0])]  # back to back, one sync below
  refs = [twin(ref, *a) for a in args]
  ys, refs, ins = host(ys), host(refs), [host(i) for i in ins]
  for r, (y, (x, w1, w2), want) in enumerate(zip(ys, ins + ins[:1], refs + refs[:1])):
    for i in range(STEPS):
      check(y[i], want[i], x[i], w1[i], w2[i], f"scan run {r} step {i}")
  assert ys[0].tobytes() == ys[2].tobytes(), (
      f"scan replay of inputs A differs in {np.count_nonzero(ys[0] != ys[2])} elements")

  # (b) one executable per step, dispatched 50 times (+1 repeat), one sync at the end.
  fused, ref = step_of("fused"), step_of("reference")
  ins = [draw() for _ in range(STEPS)]
  args = [(put(x, mesh, X), put(w1, mesh, W1), put(w2, mesh, W2)) for x, w1, w2 in ins]
  n_step = graphs(fused, *args[0])
  ys = [fused(*a) for a in args] + [fused(*args[0])]
  refs = [twin(ref, *a) for a in args]
  ys, refs, ins = host(ys), host(refs), [host(i) for i in ins]
  for i, (y, (x, w1, w2), want) in enumerate(zip(ys, ins + ins[:1], refs + refs[:1])):
    check(y, want, x, w1, w2, f"dispatch {i}")
  assert ys[0].tobytes() == ys[-1].tobytes(), (
      f"repeat of dispatch 0 differs in {np.count_nonzero(ys[0] != ys[-1])} elements")

  print(f"GRAPH_OK {dtype_name}: {STEPS} scan steps x 3 runs, {STEPS + 1} dispatches; "
        f"'command_buffer' in optimized HLO: scan {n_scan}, step {n_step}", flush=True)


if __name__ == "__main__":
  if sys.argv[1:2] != ["--worker"] or len(sys.argv) != 3:
    sys.exit("usage: python test_graph_replay.py --worker float32|bfloat16")
  _worker(sys.argv[2])
