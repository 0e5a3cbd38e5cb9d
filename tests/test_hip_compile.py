"""HIP code generation of every portable kernel for gfx90a (MI200), gfx942
(MI300X) and gfx950 (MI355X), with a resource report and recorded bounds
(issue 25; tests/hip/hip_codegen.py does the work, scripts/hip_check.sh is its
command line). CI installs the toolchain and sets KOSMOS_REQUIRE_HIP=1, so a
missing compiler fails there instead of skipping."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "hip"))
import hip_codegen as hc  # noqa: E402

REQUIRE = os.environ.get("KOSMOS_REQUIRE_HIP", "") not in ("", "0")
SCRIPT = os.path.join(ROOT, "scripts", "hip_check.sh")


def _toolchains_or_skip(work, targets=hc.TARGETS):
  tc = hc.Toolchains(str(work))
  try:
    for t in targets:
      tc.check(t)
  except hc.ToolchainMissing as e:
    if REQUIRE:
      pytest.fail(f"KOSMOS_REQUIRE_HIP=1 but {e}")
    pytest.skip(str(e))
  return tc


def _script(*args):
  return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=1500)


@pytest.fixture(scope="module")
def check(tmp_path_factory):
  """One run of the check as CI's entry point runs it: all targets, the real
  translation unit, the recorded bounds. Returns (reports, stdout, {target: assembly file})."""
  work = tmp_path_factory.mktemp("hip_check")
  _toolchains_or_skip(work)
  out = work / "report.json"
  r = _script("--json", str(out), "--keep", str(work / "asm"))
  assert r.returncode == 0, f"scripts/hip_check.sh failed (exit {r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
  with open(out) as f:
    reports = {t: [hc.KernelReport(**k) for k in ks] for t, ks in json.load(f).items()}
  asm = {os.path.basename(p).split(".")[-2]: p for p in glob.glob(str(work / "asm" / "*" / "*.s"))}
  return reports, r.stdout, asm


def _instantiated_kernels():
  """The kernels tests/hip/kernels_hip.hip instantiates, named as the report
  names them."""
  with open(hc.DEFAULT_TU) as f:
    src = f.read()
  names = set()
  for m in re.finditer(r"^template __global__ void (\w+<[^>]*>)\(", src, re.M):
    n = m.group(1).replace("gemm::Layout::", "").replace("bf16_t", "bf16").replace(" ", "")
    names.add(n)
  return names


def test_every_portable_kernel_becomes_code_for_every_target(check):
  reports, stdout, _ = check
  assert set(reports) == set(hc.TARGETS)
  want = _instantiated_kernels()
  assert len(want) >= 14, want  # 10 TP+SP instantiations, 4 portable_gemm
  for target, reps in reports.items():
    assert {r.name for r in reps} == want, f"{target}: kernels generated differ from the TU's list"
    for r in reps:
      assert r.wavefront == 64, f"{target} {r.name}: wavefront {r.wavefront}"
      assert r.code_bytes > 0 and r.vgprs > 0, f"{target} {r.name}: no code or registers in the report"
      assert not r.dynamic_stack, f"{target} {r.name}: dynamic stack (recursion or an indirect call)"
  assert "generated code for" in stdout and "ag_tn_kernel<bf16>" in stdout  # the printed report


def test_fused_kernels_hold_the_flag_atomics_and_timers(check):
  """Code generation, not just parsing: the system-scope release/acquire of the
  cross-GPU flags and the wall-clock timer are in the fused kernels' code."""
  reports, _, asm = check
  with open(asm["gfx950"]) as f:
    bodies = hc._functions(f.read())
  for r in reports["gfx950"]:
    if not r.name.startswith(("ag_tn_kernel", "tn_rs_kernel")):
      continue
    seq = hc.memory_sequence(bodies[r.symbol])
    assert "buffer_wbl2 sc0 sc1" in seq and "buffer_inv sc0 sc1" in seq, f"{r.name}: no system-scope release/acquire"
    assert "s_memrealtime" in seq, f"{r.name}: no timer"


def test_bounds_catch_growth_missing_and_stale_entries(check):
  reports, _, _ = check
  bounds = hc.read_bounds()
  assert not hc.check_bounds(reports, bounds)  # the script passed, so must this
  victim = reports["gfx942"][0]
  key = ("gfx942", victim.name)
  grown = dict(bounds)
  grown[key] = (victim.scratch_bytes - 1, victim.scratch_ops, victim.loop_scratch_ops, victim.calls - 1, victim.loop_calls)
  problems = hc.check_bounds(reports, grown)
  assert any("scratch bytes/lane" in p and victim.name in p for p in problems) or victim.scratch_bytes == 0
  assert any("calls" in p and victim.name in p for p in problems) or victim.calls == 0
  missing = {k: v for k, v in bounds.items() if k != key}
  assert any("no bound" in p and victim.name in p for p in hc.check_bounds(reports, missing))
  stale = dict(bounds)
  stale[("gfx942", "no_such_kernel<float>")] = (0, 0, 0, 0, 0)
  assert any("stale" in p for p in hc.check_bounds(reports, stale))


def test_a_broken_kernel_fails_the_check(tmp_path):
  """A kernel that does not compile makes the CI entry point fail, on every target."""
  _toolchains_or_skip(tmp_path)
  tu = tmp_path / "broken.hip"
  tu.write_text('#include "kosmos/platform.h"\n'
                "__global__ void broken_kernel(uint64_t* p) { kosmos::st_release_sys(p, not_declared(p)); }\n")
  for t in hc.TARGETS:
    with pytest.raises(hc.CompileError, match="not_declared"):
      hc.compile_tu(t, str(tu), str(tmp_path), hc.Toolchains(str(tmp_path)))
  r = _script("--tu", str(tu), "--bounds", "none")
  assert r.returncode == 1 and "FAILED" in r.stderr and "not_declared" in r.stderr, r.stderr[-3000:]


def test_a_call_nothing_defines_fails_the_check(tmp_path):
  """A kernel that compiles but calls a device function the module lacks (a
  real build could not link it) fails too."""
  _toolchains_or_skip(tmp_path)
  tu = tmp_path / "unresolved.hip"
  tu.write_text('#include "kosmos/platform.h"\n'
                'extern "C" __device__ uint64_t kosmos_not_defined(uint64_t);\n'
                "__global__ void calls_out(uint64_t* p) { *p = kosmos_not_defined(*p); }\n")
  r = _script("--tu", str(tu), "--bounds", "none")
  assert r.returncode == 1 and "kosmos_not_defined" in r.stderr and "does not define" in r.stderr, r.stderr[-3000:]


def test_a_kernel_beyond_its_bound_fails_the_check(tmp_path):
  """A kernel that spills to scratch (a dynamically indexed local array) against
  a recorded bound of none fails with the measured and recorded figures."""
  _toolchains_or_skip(tmp_path)
  tu = tmp_path / "scratchy.hip"
  tu.write_text('#include "kosmos/platform.h"\n'
                "__global__ void scratchy(const int* idx, float* out) {\n"
                "  float a[64];\n"
                "  for (int i = 0; i < 64; ++i) a[i] = out[i * 64 + threadIdx.x];\n"
                "  out[threadIdx.x] = a[idx[threadIdx.x] & 63];\n"
                "}\n")
  bounds = tmp_path / "bounds.txt"
  bounds.write_text("".join(f"{t} scratchy 0 0 0 0 0\n" for t in hc.TARGETS))
  r = _script("--tu", str(tu), "--bounds", str(bounds))
  assert r.returncode == 1, r.stdout + r.stderr
  for t in hc.TARGETS:
    assert re.search(rf"{t} scratchy: scratch bytes/lane \d+ > bound 0", r.stderr), r.stderr[-3000:]
