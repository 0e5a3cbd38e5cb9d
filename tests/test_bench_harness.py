"""benchmarks/harness.time_interleaved: every arm runs the same number of windows, the arms
alternate window by window (reversing each round), and each arm's median is its own."""
import pathlib
import sys
import time

import jax.numpy as jnp

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_time_interleaved_alternates_arms_and_keeps_them_apart():
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import harness
  log = []

  def arm(name, seconds):
    def fn(x):
      log.append(name)
      time.sleep(seconds)
      return x
    return fn

  fns = {"a": arm("a", 0.001), "b": arm("b", 0.004)}
  sets = [(jnp.zeros(4),), (jnp.ones(4),)]
  out = harness.time_interleaved(fns, sets, calls=3, rounds=4, warmup_s=0.0)
  assert set(out) == {"a", "b"} and all(t.reps == 4 and t.calls_per_rep == 3 for t in out.values())
  assert log == list("aaabbb" "bbbaaa" "aaabbb" "bbbaaa")  # no warm-up windows at warmup_s=0
  assert 0.9 < out["a"].median_ms < 3.5 and 3.9 < out["b"].median_ms < 8, out
