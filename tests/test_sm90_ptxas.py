"""ptxas check of the Hopper kernels (no GPU needed): scripts/sm90_ptxas_check.sh
compiles the sm_90a translation units to cubins and fails if ptxas serialised any
wgmma (C7510), which one stray call in a wgmma kernel (a printf) causes silently, or if
the MoE megakernels' EP = 1 instantiations spill beyond their bounds (extra code in the
one kernel once made the dispatch's row copy spill, silently 1.14x slower).
CI sets KOSMOS_REQUIRE_SM90_CHECK=1, so a missing nvcc or nvidia-cutlass fails
there instead of skipping."""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRE = os.environ.get("KOSMOS_REQUIRE_SM90_CHECK", "") not in ("", "0")


def test_no_wgmma_serialisation_in_sm90_kernels():
  missing = [what for what, ok in (("nvcc", shutil.which(os.environ.get("NVCC", "nvcc")) is not None),
                                   ("nvidia-cutlass", importlib.util.find_spec("cutlass_library") is not None))
             if not ok]
  if missing:
    if REQUIRE:
      pytest.fail(f"KOSMOS_REQUIRE_SM90_CHECK=1 but {', '.join(missing)} missing")
    pytest.skip(f"{', '.join(missing)} not available")
  r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "sm90_ptxas_check.sh")], capture_output=True, text=True,
                     timeout=900, env=dict(os.environ, PYTHON=sys.executable))
  assert r.returncode == 0, f"sm90 ptxas check failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
  assert "sm90_ptxas_check: ok" in r.stdout
