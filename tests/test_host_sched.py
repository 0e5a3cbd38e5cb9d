"""Host emulation of the AG+GEMM scheduler (DESIGN.md §6): the device headers'
queue, flag, role and schedule code (kernels/tp/ag_sched.h, the one CTA life
ag_cta) compiled with the host C++ compiler and run by N ranks x W threads with
random delays (W = 1 included), with the launchers' mover rule and either
engine's builders. The driver, tests/host/ag_sched_emu.cc, checks exactly-once
moves and builds, no stale or overwritten rows, and no deadlock (bounded waits)."""
import subprocess

import pytest

from host_build import CXX, build


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++/c++/clang++) found")
def test_ag_scheduler_emulated(tmp_path):
  exe = build(tmp_path, "ag_sched_emu.cc")
  r = subprocess.run([exe], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, f"emulated AG scheduler failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
  assert "0 failures" in r.stdout, r.stdout[-2000:]
