"""Compiles the host drivers in tests/host/ against the device headers with the
host C++ compiler: how the CPU runs the kernels' scheduling code (DESIGN.md §6)."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CXX = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def build(tmp_path, source: str, *extra_flags: str, name: str = "emu") -> str:
  """Compile tests/host/<source> (warnings are errors); returns the executable's path."""
  assert CXX is not None, "no host C++ compiler (g++/c++/clang++) found"
  exe = str(tmp_path / name)
  cmd = [CXX, "-std=c++17", "-O1", "-pthread", "-Wall", "-Wextra", "-Werror", *extra_flags,
         "-I", os.path.join(ROOT, "kernels", "include"), "-I", os.path.join(ROOT, "kernels"),
         os.path.join(ROOT, "tests", "host", source), "-o", exe]
  r = subprocess.run(cmd, capture_output=True, text=True)
  assert r.returncode == 0, f"compile failed: {' '.join(cmd)}\n{r.stderr}"
  return exe


def sm90_cubin(tmp_path, source: str) -> str:
  """Compile tests/host/<source> as sm_90a device code with ptxas's report; returns
  that report (stderr). Skips without nvcc, unless CI requires the check
  (KOSMOS_REQUIRE_SM90_CHECK=1), where a missing nvcc fails."""
  nvcc = shutil.which(os.environ.get("NVCC", "nvcc"))
  if nvcc is None:
    if os.environ.get("KOSMOS_REQUIRE_SM90_CHECK", "") not in ("", "0"):
      pytest.fail("KOSMOS_REQUIRE_SM90_CHECK=1 but nvcc is missing")
    pytest.skip("nvcc not available")
  cmd = [nvcc, "-std=c++17", "-O3", "-arch=sm_90a", "-cubin", "-Xptxas", "-v",
         "-I", os.path.join(ROOT, "kernels", "include"), "-I", os.path.join(ROOT, "kernels"),
         "-o", str(tmp_path / "device.cubin"), os.path.join(ROOT, "tests", "host", source)]
  r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
  return r.stderr


def amdgpu_reports(tmp_path, source: str) -> dict:
  """Compile tests/host/<source> through the HIP code-generation check's compilers
  (tests/hip/hip_codegen.py) for each of its targets; returns {target: [KernelReport]}.
  Skips without those toolchains, unless CI requires the check (KOSMOS_REQUIRE_HIP=1),
  where a missing one fails."""
  import sys
  sys.path.insert(0, os.path.join(ROOT, "tests", "hip"))
  import hip_codegen as hc
  try:
    for t in hc.TARGETS:
      hc.Toolchains(str(tmp_path)).check(t)
  except hc.ToolchainMissing as e:
    if os.environ.get("KOSMOS_REQUIRE_HIP", "") not in ("", "0"):
      pytest.fail(f"KOSMOS_REQUIRE_HIP=1 but {e}")
    pytest.skip(str(e))
  return hc.generate(hc.TARGETS, src=os.path.join(ROOT, "tests", "host", source), workdir=str(tmp_path))
