"""The Hopper GEMM's static tile orders (kernels/gemm/tile_order.h), compiled for
the host: every tile claimed exactly once, and 2-CTA clusters claiming in
lockstep (the TMA multicast of the shared B tile relies on it)."""
import subprocess

import pytest

from host_build import CXX, build


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++/c++/clang++) found")
def test_tile_orders(tmp_path):
  exe = build(tmp_path, "tile_order_check.cc", name="tile_order_check")
  r = subprocess.run([exe], capture_output=True, text=True, timeout=60)
  assert r.returncode == 0 and " 0 failures" in r.stdout, f"{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
