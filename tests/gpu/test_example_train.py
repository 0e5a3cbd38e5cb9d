"""examples/train.py --moe on one GPU with every fused kernel (issue 28): the decoder in
bf16 with the fused MoE's widths trains under KOSMOS_IMPL=fused, both MoE directions and
the TP+SP linears fused, with its loss at every checkpoint against the unsharded twin's
(the example's own parity check) and its loss going down. A subprocess: the example sets
up JAX itself."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_train_moe_fused_bf16():
  if not any(d.platform == "gpu" for d in jax.devices()):
    pytest.skip("no GPU")
  env = dict(os.environ, KOSMOS_IMPL="fused")
  r = subprocess.run([sys.executable, "examples/train.py", "--moe", "--dtype", "bfloat16", "--hidden", "128",
                      "--steps", "60"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, f"exit {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
  head = next(line for line in r.stdout.splitlines() if line.startswith("devices:"))
  fused = head.split("fused: ", 1)[1].split(";", 1)[0].split(", ")
  assert {"moe_forward", "moe_backward"} <= set(fused), head
  assert "parity: OK" in r.stdout and "loss going down: OK" in r.stdout, r.stdout[-2000:]
