"""Host emulation of the GEMM+RS scheduler (DESIGN.md §5-§6): the device headers'
queue, flag, role and schedule code (kernels/tp/rs_sched.h, the one CTA life
rs_cta) compiled with the host C++ compiler and run by N ranks (1, 2, 3, 4, 8),
each launching a grid of W resident CTAs, one thread each (W = 1 included), with
either engine's timing, random delays, several epochs back to back with fresh
data. The driver, tests/host/rs_sched_emu.cc, checks exactly-once builds and
reductions, the bitwise fixed-order fp32 sum rounded once (and identical across
interleavings), waits only on claimed work, reducers that never build, no stale
or early-reused staging, and no deadlock (bounded waits trap)."""
import subprocess

import pytest

from host_build import CXX, build


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++/c++/clang++) found")
def test_rs_scheduler_emulated(tmp_path):
  exe = build(tmp_path, "rs_sched_emu.cc")
  r = subprocess.run([exe], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, f"emulated RS scheduler failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
  assert r.stdout.rstrip().endswith(", 0 failures"), r.stdout[-2000:]
