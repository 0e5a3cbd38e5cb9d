"""GPU tests: skipped cleanly unless the CUDA kernels are compiled and JAX sees GPUs.

Run them on a GPU host with `KOSMOS_TEST_PLATFORMS=cuda,cpu pytest -m gpu tests/gpu`
(tests/conftest.py pins JAX to the CPU otherwise).
"""
import os
import sys

import pytest

# Fused kernels fill their outputs with NaN before running, so an unwritten
# element fails the comparison (DESIGN.md §6). Read once, at the first launch.
os.environ.setdefault("KOSMOS_POISON_OUTPUT", "1")
os.environ.setdefault("KOSMOS_TIMEOUT_MS", "20000")
# Leave GPU memory to the symmetric heaps and to the multi-process workers.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# tests/helpers.py, importable as `helpers` like the CPU tests do.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_collection_modifyitems(config, items):
  import kosmos_jax
  state = kosmos_jax.available()
  skip = None if state else pytest.mark.skip(reason=f"kosmos GPU kernels unavailable: {state.reason}")
  for item in items:
    if "tests/gpu" in str(item.fspath).replace("\\", "/"):
      item.add_marker(pytest.mark.gpu)
      if skip is not None:
        item.add_marker(skip)
