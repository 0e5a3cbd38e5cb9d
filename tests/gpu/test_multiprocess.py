"""The fused kernels with one process per GPU under jax.distributed (IPC heaps):
each worker script (mp_*_worker.py) runs one process's side of the test and prints
MP_OK when every check passed.
  mp_ag_tn_worker.py  AG+GEMM
  mp_tn_rs_worker.py  GEMM+RS: fresh bf16/f32 inputs, poisoned outputs, calls back to
                      back, against the twin and a float64 oracle, bitwise across runs
                      and grids
  mp_timeout_worker.py  a peer that never calls: the wait times out, is reported,
                      and the call fails instead of hanging"""
import os
import socket
import subprocess
import sys

import jax
import pytest


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_pair(worker):
  """Runs both processes of `worker`; returns [(returncode, output)] per process."""
  n = len([d for d in jax.devices() if d.platform == "gpu"])
  if n < 2:
    pytest.skip(f"needs 2 GPUs, found {n}")
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), worker)
  port = str(_free_port())
  env = dict(os.environ, JAX_PLATFORMS="cuda", XLA_PYTHON_CLIENT_MEM_FRACTION="0.3")
  env.pop("XLA_FLAGS", None)
  procs = [subprocess.Popen([sys.executable, path, str(i), "2", port], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outs = []
  for p in procs:
    try:
      outs.append(p.communicate(timeout=240)[0])
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      pytest.fail(f"{worker}: multi-process workers timed out")
  return [(p.returncode, out) for p, out in zip(procs, outs)]


@pytest.mark.parametrize("worker", ["mp_ag_tn_worker.py", "mp_tn_rs_worker.py"])
def test_fused_two_processes(worker):
  for i, (rc, out) in enumerate(_run_pair(worker)):
    assert rc == 0 and f"MP_OK process {i}" in out, f"{worker} process {i} rc={rc}:\n{out[-6000:]}"


def test_timeout_is_reported_and_fails():
  (rc0, out0), _ = _run_pair("mp_timeout_worker.py")
  assert "MP_TIMEOUT_RAISED" in out0, f"process 0 rc={rc0}:\n{out0[-6000:]}"
  assert "sm90_runs=1" in out0, f"the Hopper-builder kernel did not run:\n{out0[-6000:]}"
  assert "kosmos timeout: kernel=ag_tn" in out0, f"no timeout report:\n{out0[-6000:]}"
  assert "expected>=" in out0 and "after 1500 ms" in out0, out0[-6000:]
