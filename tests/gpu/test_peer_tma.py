"""Peer TMA check (issue 29, step 0): tests/gpu/peer_tma/peer_tma.cu, built with nvcc and
run as its own process. Rank to rank, a byte-exact TMA store into the peer's buffer and
TMA load from it, then both directions at once with sequence-stamped tiles, every byte
checked after its flag's acquire, read by TMA and by plain loads. On one GPU both ranks
share its memory and L2 (the protocol only: `--loopback`); with two GPUs the tiles cross
NVLink, which no loopback run can show (kosmos/proxy.h says why the fences matter there)."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "gpu" / "peer_tma" / "peer_tma.cu"


def build(tmp_path, nvcc: str) -> str:
  exe = str(tmp_path / "peer_tma")
  cmd = [nvcc, "-std=c++17", "-O2", "-arch=sm_90a", "-I", str(ROOT / "kernels" / "include"), "-o", exe, str(SOURCE)]
  r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-3000:]}"
  return exe


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  cc = getattr(gpus[0], "compute_capability", None) if gpus else None
  if cc != "9.0":
    pytest.skip(f"needs compute capability 9.0 (the sm_90a build's TMA); first GPU's: {cc}")
  nvcc = shutil.which(os.environ.get("NVCC", "nvcc"))
  if nvcc is None:
    pytest.fail("nvcc is needed to build tests/gpu/peer_tma/peer_tma.cu on a GPU host")
  return build(tmp_path_factory.mktemp("peer_tma"), nvcc)


def run(exe, *args):
  r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
  out = r.stdout + r.stderr
  assert r.returncode == 0, out[-4000:]
  assert out.count("exact TMA store") == 2 and out.count("exact TMA load") == 2, out
  assert "MISMATCH" not in out and out.count("mismatches 0") == 2 and "PASS" in out, out
  return out


def test_peer_tma_loopback(exe):
  print(run(exe, "--loopback", "--iters", "20000"))


def test_peer_tma_across_gpus(exe):
  n = len([d for d in jax.devices() if d.platform == "gpu"])
  if n < 2:
    pytest.skip(f"{n} GPU visible: the across-GPU run needs two")
  print(run(exe, "--devices", "0,1", "--iters", "50000"))
  if n >= 8:  # the farthest pair of an 8-GPU node, both ways at once
    print(run(exe, "--devices", "0,7", "--iters", "50000"))
