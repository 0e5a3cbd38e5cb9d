"""Host emulation of the MoE forward schedule (DESIGN.md §5-§6): the device
headers' queue, flag and plan code and kernels/moe/fwd_sched.h (the one CTA life
moe_fwd_cta) compiled with the host C++ compiler and run by ep ranks (1, 2, 3, 4, 8)
x W CTAs (1, 2, several; one mover, a few or all), random delays, several epochs
back to back whose routings change: balanced, skewed, every token to the same k
experts (k = 1: one expert), every token to one rank's experts (zero rows
elsewhere), with capacities that fit, overflow into the dropless mode, or both.
The driver, tests/host/moe_fwd_sched_emu.cc, computes small integer-valued
"GEMMs" and checks the fold against a direct per-token computation, exactly-once
items and releases, every read after the flag that publishes it, the mode every
rank agrees on and the arena it fits, and no deadlock (bounded waits trap,
naming the flag). A second check compiles the schedule as sm_90a device code."""
import subprocess

import pytest

from host_build import CXX, build, sm90_cubin


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++/c++/clang++) found")
def test_moe_forward_scheduler_emulated(tmp_path):
  exe = build(tmp_path, "moe_fwd_sched_emu.cc")
  r = subprocess.run([exe], capture_output=True, text=True, timeout=180)
  assert r.returncode == 0, f"emulated MoE forward scheduler failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
  assert r.stdout.rstrip().endswith(", 0 failures"), r.stdout[-2000:]


def test_moe_forward_schedule_compiles_as_sm90_device_code(tmp_path):
  """moe_fwd_cta over a device Ops (tests/host/moe_fwd_sched_kernel.cu) compiles for
  sm_90a without spills."""
  report = sm90_cubin(tmp_path, "moe_fwd_sched_kernel.cu")
  assert "moe_fwd_check_kernel" in report, report[-3000:]
  assert "0 bytes spill stores, 0 bytes spill loads" in report, report[-3000:]
