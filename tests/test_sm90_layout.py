"""Host check of the Hopper epilogue's staged-tile addressing (tests/host/sm90_staged_layout.cu):
the hand-written swizzle that stage_tile and combine_tile write and read must be the CuTe layout
the TMA store descriptors are built from, or tiles leave scrambled. Needs nvcc and nvidia-cutlass
(as the ptxas check: CI sets KOSMOS_REQUIRE_SM90_CHECK=1, so there a missing tool fails)."""
import importlib.util
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = os.environ.get("NVCC", "nvcc")
REQUIRE = os.environ.get("KOSMOS_REQUIRE_SM90_CHECK", "") not in ("", "0")


def test_staged_tile_swizzle_matches_the_tma_layout(tmp_path):
  if shutil.which(NVCC) is None or importlib.util.find_spec("cutlass_library") is None:
    if REQUIRE:
      pytest.fail("KOSMOS_REQUIRE_SM90_CHECK=1 but nvcc or nvidia-cutlass is missing")
    pytest.skip("nvcc or nvidia-cutlass not available")
  import cutlass_library
  cute = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")
  exe = str(tmp_path / "layout")
  cmd = [NVCC, "-std=c++17", "--expt-relaxed-constexpr", "-arch=sm_90a", "-I", cute,
         "-I", os.path.join(ROOT, "kernels", "include"), "-I", os.path.join(ROOT, "kernels"),
         os.path.join(ROOT, "tests", "host", "sm90_staged_layout.cu"), "-o", exe]
  r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, f"compile failed: {' '.join(cmd)}\n{r.stderr[-4000:]}"
  run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
  assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout
