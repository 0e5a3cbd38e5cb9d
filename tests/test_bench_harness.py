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


def test_time_sustained_settles_each_arm_then_times_it_alone():
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import harness
  log = []

  def arm(name):
    def fn(x):
      log.append(name)
      return x
    return fn

  sets = [(jnp.zeros(4),)]
  out = harness.time_sustained({"a": arm("a"), "b": arm("b")}, sets, calls=3, reps=2, settle_s=0.0)
  assert set(out) == {"a", "b"} and all(t.reps == 2 and t.calls_per_rep == 3 for t in out.values())
  assert log == ["a"] * (2 + 6) + ["b"] * (2 + 6)  # two settling calls at settle_s=0, then 2 x 3 timed


def test_gemm_bench_shape_rows_under_every_protocol(monkeypatch, tmp_path):
  """benchmarks/gemm.py's per-shape plumbing on CPU, its kosmos arm swapped for the reference
  twin (the fused one needs a GPU): one cuBLAS row, then a full-GPU and a capped kosmos row."""
  import functools
  import jax
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import gemm
  from kosmos_jax import ops
  monkeypatch.setattr(gemm, "kosmos", lambda layout, cap: jax.jit(
      functools.partial(ops.matmul, layout=layout, impl="reference")))
  sh = dict(name="tiny", M=64, N=32, K=48)
  for protocol in ("interleaved", "sustained", "blocks", "blocks-kosmos-first"):
    rows = gemm.bench_shape("NT", sh, [100], reps=2, cap_reps=1, protocol=protocol, settle_s=0.0)
    assert [(r["arm"], r["cu_cap"]) for r in rows] == [("xla_cublas", 0), ("kosmos", 0), ("kosmos", 100)], protocol
    assert rows[1]["rel_err_vs_cublas"] < 1e-2 and all(r["median_ms"] > 0 for r in rows), rows
    if protocol == "sustained":
      sustained_rows = rows
  # --from-csv: a measured CSV read back gives the same summary as the rows it was written from
  path = tmp_path / "gemm.csv"
  gemm.harness.write_csv(sustained_rows, path)
  back = gemm.read_rows(path)
  assert back == sustained_rows
  assert gemm.summarize(back, [100]) == gemm.summarize(sustained_rows, [100])


def test_time_interleaved_per_arm_inputs_and_calls():
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import harness
  seen = []
  fn = lambda tag: (lambda x: seen.append((tag, float(x[0]))) or x)
  sets = {"a": [(jnp.zeros(1),)], "b": [(jnp.ones(1),), (2 * jnp.ones(1),)]}
  out = harness.time_interleaved({"a": fn("a"), "b": fn("b")}, sets, calls={"a": 1, "b": 2}, rounds=2,
                                 warmup_s=0.0)
  assert (out["a"].calls_per_rep, out["b"].calls_per_rep) == (1, 2)
  assert seen == [("a", 0.0), ("b", 1.0), ("b", 2.0), ("b", 1.0), ("b", 2.0), ("a", 0.0)]


def test_warm_up_fills_its_time_from_the_first_calls_pace():
  """harness._warm: `first` calls, then as many as the pace after the first call needs to fill
  the time (a count every process agrees on, so collective arms stay matched); no calls when
  neither is asked."""
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import harness
  calls = []
  harness._warm(lambda i: calls.append(i), 3, 0.0)
  assert calls == [0, 1, 2]
  calls.clear()
  harness._warm(lambda i: calls.append(i), 0, 0.0)
  assert calls == []
  calls.clear()
  harness._warm(lambda i: (calls.append(i), time.sleep(0.01)), 1, 0.06)
  assert 5 <= len(calls) <= 8 and calls == list(range(len(calls))), calls  # 1 untimed + ~6 x 10 ms
  calls.clear()
  harness._warm(lambda i: (calls.append(i), time.sleep(0.05 if i == 0 else 0.005)), 2, 0.02)
  assert len(calls) >= 4, calls  # the slow first call (a compile) does not count towards the pace
