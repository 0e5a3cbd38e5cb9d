"""Host emulation of the MoE schedules (DESIGN.md §5-§6): the device headers'
queue, flag and plan code and kernels/moe/fwd_sched.h (the one CTA life
moe_fwd_cta) with the forward's build queue and the backward's
(kernels/moe/bwd_queues.h: dgrad2, dgrad1, then the weight gradients), compiled
with the host C++ compiler and run by ep ranks (1, 2, 3, 4, 8)
x W CTAs (1, 2, several; one mover, a few or all), random delays, several epochs
back to back whose routings change: balanced, skewed, every token to the same k
experts (k = 1: one expert), every token to one rank's experts (zero rows
elsewhere), with capacities that fit, overflow into the dropless mode, or both.
The driver, tests/host/moe_fwd_sched_emu.cc, computes small integer-valued
"GEMMs" and checks the fold (forward: y; backward: dX) and the backward's weight
gradients against direct computations, exactly-once
items and releases, every read after the flag that publishes it, the mode every
rank agrees on and the arena it fits, and no deadlock (bounded waits trap,
naming the flag). A second check compiles the schedule as sm_90a device code."""
import re
import subprocess

import pytest

from host_build import CXX, build, sm90_cubin


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++/c++/clang++) found")
def test_moe_forward_scheduler_emulated(tmp_path):
  exe = build(tmp_path, "moe_fwd_sched_emu.cc")
  r = subprocess.run([exe], capture_output=True, text=True, timeout=180)
  assert r.returncode == 0, f"emulated MoE forward scheduler failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
  assert r.stdout.rstrip().endswith(", 0 failures"), r.stdout[-2000:]


def test_moe_schedules_compile_as_sm90_device_code(tmp_path):
  """moe_fwd_cta over device Ops (tests/host/moe_fwd_sched_kernel.cu), with the
  forward's and the backward's build queue, compiles for sm_90a without spills."""
  report = sm90_cubin(tmp_path, "moe_fwd_sched_kernel.cu")
  for kernel in ("moe_fwd_check_kernel", "moe_bwd_check_kernel"):
    assert kernel in report, report[-3000:]
  spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
  assert len(spills) >= 2 and all(a == b == "0" for a, b in spills), report[-3000:]
