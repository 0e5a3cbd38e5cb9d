"""Host emulation of the bulk RS || NT scheduler (DESIGN.md §5-§6): the device
headers' queue, flag, role and schedule code (kernels/tp/bulk_rs_sched.h) compiled
with the host C++ compiler and run by N ranks (1, 2, 3, 4, 8), each launching a
grid of G CTAs on W resident threads (W = 1 and a grid of 1 CTA per rank included,
G > W included), random delays, several epochs back to back with fresh data, both
the switching life and the fixed split. The driver, tests/host/bulk_rs_sched_emu.cc,
checks exactly-once pushes, GEMM tiles and reductions, the bitwise fixed-order fp32
sum rounded once (and identical across interleavings), pushes only into announced
staging and no stale or early-overwritten reads, announcements before waits, reduces
only after the rank's pushes are claimed, and no deadlock (bounded waits abort)."""
import subprocess

import pytest

from host_build import CXX, build


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++/c++/clang++) found")
def test_bulk_rs_scheduler_emulated(tmp_path):
  exe = build(tmp_path, "bulk_rs_sched_emu.cc")
  r = subprocess.run([exe], capture_output=True, text=True, timeout=180)
  assert r.returncode == 0, f"emulated bulk RS scheduler failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
  assert r.stdout.rstrip().endswith(", 0 failures"), r.stdout[-2000:]
