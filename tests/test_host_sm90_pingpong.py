"""Host model of the Hopper engine's pingpong consumers (kernels/gemm/sm90/tile_pingpong.cuh):
one CTA's claimer, loading thread and two consumer warp groups as host threads with random
delays, with the hardware's parity-wait and named-barrier semantics (tests/host/
sm90_pingpong_emu.cc). Checks every tile computed once by its group, the tensor cores fed in
claim order, no stage overwritten early, no false parity pass, no deadlock."""
import subprocess

import pytest

from host_build import CXX, build


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++/c++/clang++) found")
def test_pingpong_turns_emulated(tmp_path):
  exe = build(tmp_path, "sm90_pingpong_emu.cc")
  r = subprocess.run([exe], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, f"pingpong model failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
  assert "0 failures" in r.stdout, r.stdout[-2000:]
