"""benchmarks/gemm_power.py on CPU (reference arm, no nvidia-smi): it runs both arms
twice each and writes one CSV row per arm and repetition. Tests never time, so no
number is checked."""
import csv
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_power_script_smoke(tmp_path):
  out = tmp_path / "power.csv"
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  proc = subprocess.run([sys.executable, "benchmarks/gemm_power.py", "--impl", "reference", "--mnk", "128,64,32",
                         "--seconds", "0.05", "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  rows = list(csv.DictReader(out.open()))
  assert [(r["arm"], r["rep"]) for r in rows] == [("xla_cublas", "0"), ("kosmos_reference", "0"),
                                                  ("xla_cublas", "1"), ("kosmos_reference", "1")]
  assert all(int(r["calls"]) >= 8 for r in rows)


def test_profile_once_script_smoke():
  """benchmarks/gemm_profile_once.py (run under ncu by scripts/gpu_profile.sh ncu) on CPU: both arms are
  compiled and called once in the profiled range (a no-op without libcuda)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  proc = subprocess.run([sys.executable, "benchmarks/gemm_profile_once.py", "--impl", "reference", "--layout", "TN",
                         "--shape", "8B-QKV-MBS1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert [l.split(":")[0] for l in proc.stdout.splitlines() if l.startswith("profiled")] == [
      "profiled xla_cublas", "profiled kosmos"]
  bad = subprocess.run([sys.executable, "benchmarks/gemm_profile_once.py", "--impl", "reference", "--shape", "nope"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert bad.returncode != 0 and "unknown shape 'nope'" in bad.stderr
