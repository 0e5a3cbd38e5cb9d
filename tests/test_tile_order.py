"""The Hopper GEMM's host-side decisions, compiled for the host: the static
swizzled tile order claims every tile exactly once for any grid
(kernels/gemm/tile_order.h), and the wave model picks the tile shapes measured
fastest (kernels/gemm/sm90/tile_choice.h)."""
import subprocess

import pytest

from host_build import CXX, build


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler (g++/c++/clang++) found")
def test_tile_orders_and_choice(tmp_path):
  exe = build(tmp_path, "tile_order_check.cc", name="tile_order_check")
  r = subprocess.run([exe], capture_output=True, text=True, timeout=60)
  assert r.returncode == 0 and " 0 failures" in r.stdout, f"{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
