#!/usr/bin/env python3
"""HIP code generation check of the single-source device code (DESIGN.md §1, issue 25).

Compiles the kernels listed in tests/hip/kernels_hip.hip to AMDGPU assembly for
  gfx90a (MI200)  with Debian's hipcc (ROCm 5.2),
  gfx942 (MI300X) and gfx950 (MI355X) with clang 22 from the `ziglang` PyPI
    package (the project's `hip` extra), on Debian's HIP 5.2 headers,
and reads a resource report per kernel and target out of the assembly: VGPRs,
AGPRs, SGPRs, LDS, scratch bytes per lane, scratch instructions and calls
(s_swappc_b64) in the kernel's own code, the functions it calls, occupancy.
It fails when a compile fails, when a kernel calls a function the module does
not define (a real build could not link it), or when a kernel exceeds its
recorded bound (tests/hip/resource_bounds.txt).

Both compilers link the ROCm device libraries (Debian's rocm-device-libs, as
hipcc does in a real build). Without them (-nogpulib) every threadIdx,
blockDim and __syncthreads of the 5.2 headers stays a call to __ockl_* /
__atomic_work_item_fence: thousands of s_swappc_b64 and the scratch their
calling convention costs, none of which a real ROCm build has (docs/hip.md).

Used by scripts/hip_check.sh (the CLI) and tests/test_hip_compile.py (the API).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TU = os.path.join(HERE, "kernels_hip.hip")
DEFAULT_BOUNDS = os.path.join(HERE, "resource_bounds.txt")
COMPAT_INCLUDE = os.path.join(HERE, "compat")  # <hip/hip_bf16.h> for HIP < 5.7 (see the header)
TARGETS = ("gfx90a", "gfx942", "gfx950")
ZIGLANG_VERSION = "0.17.0"  # pinned in pyproject.toml's `hip` extra

HIP_HEADER = "/usr/include/hip/hip_runtime.h"                       # libamdhip64-dev
DEVICE_LIBS = "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode"            # rocm-device-libs
CLANG15_INCLUDE_GLOB = "/usr/lib/llvm-15/lib/clang/*/include"       # libclang-common-15-dev
# ISA version numbers the device libraries read (__oclc_ISA_version): major*1000
# + minor*100 + stepping, as ROCm's own oclc_isa_version_<arch>.bc define them.
# Debian's 5.2 device libs predate gfx942 and gfx950.
ISA_VERSIONS = {"gfx942": 9402, "gfx950": 9500}


class ToolchainMissing(RuntimeError):
  """A compiler, header set or device library the check needs is not installed."""


class CompileError(RuntimeError):
  """The compiler rejected the translation unit (its diagnostics are the message)."""


class CheckFailed(RuntimeError):
  """Code was generated but breaks a rule of the check (unresolved call, bound)."""


# ---- toolchains ----------------------------------------------------------------


def _run(cmd, timeout=900, env=None):
  return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def hipcc_path():
  exe = shutil.which(os.environ.get("HIPCC", "hipcc"))
  if exe is None:
    raise ToolchainMissing("hipcc not found (gfx90a): apt-get install hipcc rocm-device-libs")
  return exe


def _device_libs_dir():
  if not os.path.isfile(os.path.join(DEVICE_LIBS, "ockl.bc")):
    raise ToolchainMissing(f"ROCm device libraries not found in {DEVICE_LIBS}: apt-get install rocm-device-libs")
  return DEVICE_LIBS


def _ziglang_dir():
  try:
    import ziglang  # noqa: PLC0415 (optional: only the gfx942/gfx950 targets need it)
  except ImportError:
    raise ToolchainMissing(f"the ziglang package is not installed in {sys.executable} (gfx942/gfx950): "
                           f"pip install -e '.[hip]' (ziglang=={ZIGLANG_VERSION})") from None
  import importlib.metadata  # noqa: PLC0415
  have = importlib.metadata.version("ziglang")
  if have != ZIGLANG_VERSION:
    raise ToolchainMissing(f"ziglang {have} is installed; the check and its recorded bounds are for "
                           f"ziglang=={ZIGLANG_VERSION} (clang 22): pip install -e '.[hip]'")
  return os.path.dirname(ziglang.__file__)


def _ziglang_clang():
  return [sys.executable, "-m", "ziglang", "clang"]


def _clang15_include():
  hits = sorted(d for d in glob.glob(CLANG15_INCLUDE_GLOB) if os.path.isfile(os.path.join(d, "__clang_hip_runtime_wrapper.h")))
  if not hits:
    raise ToolchainMissing("clang 15's HIP wrapper headers (__clang_hip_runtime_wrapper.h) not found: "
                           "apt-get install libclang-common-15-dev")
  return hits[-1]


class Toolchains:
  """The two compilers and what clang 22 needs beside them, staged once per run
  in a private temporary folder (symlinks and two generated bitcode files)."""

  def __init__(self, work, device_libs=True):
    self.work = work
    # False: -nogpulib, as the first measurement compiled; calls into
    # the device libraries then stay unresolved (reported, not failed).
    self.device_libs = device_libs
    self._staged = None

  def check(self, target):
    """Raises ToolchainMissing with what to install when `target` cannot be built."""
    if target == "gfx90a":
      hipcc_path()
      _device_libs_dir()
    elif target in ISA_VERSIONS:
      self._stage()
    else:
      raise ValueError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")

  def _stage(self):
    if self._staged is not None:
      return self._staged
    zig = _ziglang_dir()
    if not os.path.isfile(HIP_HEADER):
      raise ToolchainMissing(f"{HIP_HEADER} not found (the HIP 5.2 headers): apt-get install libamdhip64-dev")
    libs = _device_libs_dir()
    c15 = _clang15_include()
    # Zig's clang has its own resource headers (stddef.h, ...) but not clang's
    # HIP/CUDA wrappers; clang 15's wrappers go on a path of their own so that
    # the rest of clang 15's resource headers do not shadow zig's.
    stage = tempfile.mkdtemp(prefix="toolchain_", dir=self.work)  # private: several may share `work`
    wrappers = os.path.join(stage, "hip_wrappers")
    os.makedirs(wrappers)
    for f in glob.glob(os.path.join(c15, "__clang_hip_*.h")) + glob.glob(os.path.join(c15, "__clang_cuda_*.h")) + [
        os.path.join(c15, "cuda_wrappers")]:
      os.symlink(f, os.path.join(wrappers, os.path.basename(f)))
    # The device libraries, plus the ISA-version control library for the two
    # targets the 5.2 set lacks, generated with the same clang.
    dl = os.path.join(stage, "device_libs")
    os.makedirs(dl)
    for f in glob.glob(os.path.join(libs, "*.bc")):
      os.symlink(f, os.path.join(dl, os.path.basename(f)))
    for arch, ver in ISA_VERSIONS.items():
      out = os.path.join(dl, f"oclc_isa_version_{arch[3:]}.bc")
      if os.path.exists(out):
        continue
      ll = os.path.join(stage, f"isa_{arch}.ll")
      with open(ll, "w") as f:
        f.write('target triple = "amdgcn-amd-amdhsa"\n'
                f"@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) constant i32 {ver}, align 4\n")
      r = _run(_ziglang_clang() + ["--target=amdgcn-amd-amdhsa", "-nogpulib", "-c", "-emit-llvm", ll, "-o", out])
      if r.returncode != 0:
        raise ToolchainMissing(f"ziglang clang could not build {out}:\n{r.stderr[-2000:]}")
    self._staged = {"zig": zig, "wrappers": wrappers, "device_libs": dl}
    return self._staged

  def command(self, target, src, out, include_dirs):
    incs = []
    for d in include_dirs:
      incs += ["-I", d]
    # After the system headers: only a HIP without <hip/hip_bf16.h> (5.2) uses it.
    incs += ["-idirafter", COMPAT_INCLUDE]
    if target == "gfx90a":
      # hipcc 5.2 links hip.bc, ocml, ockl and the oclc control libraries itself.
      return [hipcc_path(), "-std=c++17", "-O3", "-x", "hip", f"--offload-arch={target}",
              "--offload-device-only", "-S", *([] if self.device_libs else ["-nogpulib"]), *incs, src, "-o", out]
    s = self._stage()
    if self.device_libs:
      libs = [
          # Code object v5, as ROCm 6 builds by default; clang 22 would pick v6,
          # whose device-library ABI file the 5.2 set does not have.
          "-mcode-object-version=5", f"--rocm-device-lib-path={s['device_libs']}",
          # hip.bc holds __atomic_work_item_fence, which the 5.2 headers' fences
          # and __syncthreads call; clang 22 no longer links it, hipcc 5.2 did.
          "-Xclang", "-mlink-builtin-bitcode", "-Xclang", os.path.join(s["device_libs"], "hip.bc"),
          # The 5.2 ocml's math functions (expf: the MoE router's scores) read the
          # denormal-mode control variable that clang 22 no longer links; off is
          # hipcc 5.2's default (no -fgpu-flush-denormals-to-zero).
          "-Xclang", "-mlink-builtin-bitcode", "-Xclang", os.path.join(s["device_libs"], "oclc_daz_opt_off.bc")]
    else:
      libs = ["-nogpulib"]
    return _ziglang_clang() + [
        "--target=x86_64-linux-gnu", "--gcc-toolchain=/usr",  # finds /usr/include/hip (HIP 5.2)
        "-std=c++17", "-O3", "-x", "hip", f"--offload-arch={target}", "--offload-device-only", "-S", *libs,
        "-isystem", s["wrappers"], "-isystem", os.path.join(s["zig"], "lib", "include"),
        # The 5.2 headers test this macro; clang 22 no longer defines it.
        "-D__AMDGCN_WAVEFRONT_SIZE=64",
        *incs, src, "-o", out]


# ---- assembly -> report -------------------------------------------------------


@dataclasses.dataclass
class KernelReport:
  target: str
  symbol: str
  name: str
  vgprs: int
  agprs: int
  sgprs: int
  lds_bytes: int
  scratch_bytes: int    # private segment per lane, callees' frames included
  scratch_ops: int      # scratch loads/stores in the kernel's own code
  loop_scratch_ops: int  # ... of them inside loops
  calls: int            # s_swappc_b64 in the kernel's own code
  loop_calls: int       # ... of them inside loops
  callees: dict         # function -> times the kernel loads its address (a call site may reuse one)
  occupancy: int        # waves per SIMD
  dynamic_stack: bool
  wavefront: int
  code_bytes: int


_LAYOUTS = {"0": "TN", "1": "NN", "2": "NT"}  # gemm::Layout (kernels/gemm/tile_problem.h)


def short_name(demangled):
  """`void kosmos::ag_tn_kernel<hip_bfloat16>(kosmos::AgParams<hip_bfloat16>)` -> `ag_tn_kernel<bf16>`."""
  s = demangled
  if s.startswith("void "):
    s = s[5:]
  depth, cut = 0, len(s)
  for i, ch in enumerate(s):  # drop the parameter list: the first '(' outside <>
    if ch == "<":
      depth += 1
    elif ch == ">":
      depth -= 1
    elif ch == "(" and depth == 0:
      cut = i
      break
  s = s[:cut]
  s = re.sub(r"\(kosmos::gemm::Layout\)(\d)", lambda m: _LAYOUTS.get(m.group(1), m.group(0)), s)
  s = re.sub(r"\b(?:kosmos::)(?:\w+::)*", "", s)
  s = re.sub(r"\b(?:__hip_bfloat16|hip_bfloat16)\b", "bf16", s)
  s = re.sub(r"\b__half\b", "f16", s)
  return s.replace(", ", ",")


def _demangle(symbols):
  for tool in ("c++filt", "llvm-cxxfilt-15", "llvm-cxxfilt"):
    exe = shutil.which(tool)
    if exe:
      r = subprocess.run([exe], input="\n".join(symbols), capture_output=True, text=True)
      if r.returncode == 0:
        out = r.stdout.splitlines()
        if len(out) == len(symbols):
          return dict(zip(symbols, out))
  return {s: s for s in symbols}


_SCRATCH_OP = re.compile(r"^\s+(scratch_(load|store)\w*|buffer_(load|store)_\w+\s.*\bs\[0:3\])")
_CALLEE = re.compile(r"s_add_u32\s+s\d+,\s*s\d+,\s*([A-Za-z_.$][\w.$]*)@(?:rel32|gotpcrel32)@lo")
_FUNC_TYPE = re.compile(r"^\s+\.type\s+([\w.$]+),@function")


def _loop_lines(body):
  """The instruction lines of a function body that sit in a loop, by the
  compiler's own block annotations ('Loop Header', 'in Loop:'), which both
  ROCm 5.2's clang and clang 22 print."""
  out, inside = [], False
  for ln in body:
    m = re.match(r"^(\.LBB\d+_\d+|; %bb\.\d+):", ln)
    if m:
      inside = "Loop Header" in ln or "in Loop:" in ln
      continue
    if inside:
      out.append(ln)
  return out


def _functions(asm):
  """{name: body lines} of every function defined in the assembly."""
  lines = asm.splitlines()
  names = {m.group(1) for m in map(_FUNC_TYPE.match, lines) if m}
  bodies, cur = {}, None
  for ln in lines:
    if cur is None:
      head = ln.split(":", 1)[0]
      if ln.endswith(":") or ":" in ln and ln.split(":", 1)[1].lstrip().startswith(";"):
        if head in names:
          cur = head
          bodies[cur] = []
      continue
    if ln.startswith(".Lfunc_end"):
      cur = None
      continue
    bodies[cur].append(ln)
  return bodies


def _kernel_info(asm):
  """{kernel: {key: int}} from the '; Kernel info:' comment blocks both compilers print."""
  info, cur = {}, None
  lines = asm.splitlines()
  for i, ln in enumerate(lines):
    m = re.match(r"^\s+\.size\s+([\w.$]+),\s*\.Lfunc_end", ln)
    if m:
      cur = m.group(1)
      continue
    if ln.startswith("; Kernel info:") and cur is not None:
      d = {}
      for nxt in lines[i + 1:i + 40]:
        if not nxt.startswith(";"):
          break
        kv = re.match(r"^;\s*([A-Za-z]+)\s*[:=]\s*(\d+)", nxt)
        if kv:
          d[kv.group(1)] = int(kv.group(2))
      info[cur] = d
  return info


def _metadata(asm):
  """{kernel: {key: str}} from the amdhsa.kernels YAML (kernel-level keys only)."""
  if "amdhsa.kernels:" not in asm:
    return {}
  block = asm.split("amdhsa.kernels:", 1)[1].split("\n...", 1)[0].splitlines()
  kernels, cur = [], None
  for ln in block:
    if ln.startswith("  - "):
      cur = {}
      kernels.append(cur)
      ln = "    " + ln[4:]
    if cur is None:
      continue
    m = re.match(r"^    \.([a-z_0-9]+):\s*(\S+)?", ln)
    if m:
      cur[m.group(1)] = m.group(2) or ""
    elif ln and not ln.startswith("     ") and not ln.startswith("  "):
      break
  return {k["name"]: k for k in kernels if "name" in k}


def parse_report(asm, target, allow_unresolved=False):
  """One KernelReport per kernel in the module; raises CheckFailed on a call the
  module cannot resolve (unless allow_unresolved: then they count as callees)."""
  meta = _metadata(asm)
  if not meta:
    raise CheckFailed(f"{target}: no amdhsa.kernels metadata in the assembly (no kernel generated?)")
  bodies = _functions(asm)
  labels = set(re.findall(r"^([A-Za-z_.$][\w.$]*):", asm, re.M))
  info = _kernel_info(asm)
  names = _demangle(sorted(meta))
  reports = []
  for sym, md in sorted(meta.items()):
    body = bodies.get(sym)
    if body is None or not any("s_endpgm" in ln for ln in body):
      raise CheckFailed(f"{target}: kernel {sym} has metadata but no code")
    # Symbols whose address the kernel takes: functions (calls), data defined
    # here (strings, globals), or nothing defined here (unresolved).
    callees, unresolved = {}, set()
    for ln in body:
      m = _CALLEE.search(ln)
      if not m:
        continue
      name = m.group(1)
      if name in bodies:
        callees[name] = callees.get(name, 0) + 1
      elif name not in labels:
        unresolved.add(name)
        if allow_unresolved:
          callees[name] = callees.get(name, 0) + 1
    if unresolved and not allow_unresolved:
      raise CheckFailed(f"{target}: {short_name(names[sym])} references symbols the module does not define "
                        f"(a real build could not link them): {', '.join(sorted(unresolved))}")
    ki = info.get(sym, {})
    loop = _loop_lines(body)
    is_call = lambda ln: re.match(r"^\s+s_swappc_b64\b", ln)  # noqa: E731
    reports.append(KernelReport(
        target=target, symbol=sym, name=short_name(names[sym]),
        vgprs=ki.get("NumVgprs", -1), agprs=ki.get("NumAgprs", 0),
        sgprs=int(md.get("sgpr_count", -1)), lds_bytes=int(md.get("group_segment_fixed_size", 0)),
        scratch_bytes=int(md.get("private_segment_fixed_size", 0)),
        scratch_ops=sum(1 for ln in body if _SCRATCH_OP.match(ln)),
        loop_scratch_ops=sum(1 for ln in loop if _SCRATCH_OP.match(ln)),
        calls=sum(1 for ln in body if is_call(ln)), loop_calls=sum(1 for ln in loop if is_call(ln)),
        callees={short_name(_demangle([c])[c]): n for c, n in sorted(callees.items())},
        occupancy=ki.get("Occupancy", -1), dynamic_stack=md.get("uses_dynamic_stack") == "true",
        wavefront=int(md.get("wavefront_size", 0)), code_bytes=ki.get("codeLenInByte", -1)))
  return reports


_CACHE_BITS = ("sc0", "sc1", "nt", "glc", "slc")


def memory_sequence(body):
  """The memory-ordering skeleton of a function body: its global/buffer/flat
  memory instructions with their cache-policy bits, waits for vector memory
  (s_waitcnt ... vmcnt(0)), s_memrealtime and s_trap, in program order."""
  seq = []
  for ln in body:
    parts = ln.strip().split(None, 1)
    if not parts or parts[0].startswith((".", ";")) or parts[0].endswith(":"):
      continue
    op, args = parts[0], parts[1] if len(parts) > 1 else ""
    if op == "s_waitcnt":
      if "vmcnt(0)" in args:
        seq.append("s_waitcnt vmcnt(0)")
    elif re.match(r"(global|buffer|flat|scratch)_|s_memrealtime$|s_trap$", op):
      seq.append(" ".join([op] + [b for b in _CACHE_BITS if re.search(rf"\b{b}\b", args)]))
  return seq


# ---- compile ----------------------------------------------------------------


def compile_tu(target, src, workdir, toolchains=None, include_dirs=None):
  """Compiles `src` for `target`; returns (assembly text, compiler stderr).
  Raises ToolchainMissing or CompileError."""
  tc = toolchains or Toolchains(workdir)
  tc.check(target)
  if include_dirs is None:
    include_dirs = [os.path.join(ROOT, "kernels", "include"), os.path.join(ROOT, "kernels")]
  out = os.path.join(workdir, f"{os.path.splitext(os.path.basename(src))[0]}.{target}.s")
  cmd = tc.command(target, src, out, include_dirs)
  env = dict(os.environ, HIP_PLATFORM="amd")  # hipcc would pick nvcc where one is installed
  r = _run(cmd, env=env)
  if r.returncode != 0 or not os.path.isfile(out):
    raise CompileError(f"{target}: compile failed (exit {r.returncode}):\n$ {' '.join(cmd)}\n{r.stderr[-8000:]}")
  with open(out) as f:
    return f.read(), r.stderr


def generate(targets, src=DEFAULT_TU, workdir=None, include_dirs=None, jobs=None, device_libs=True):
  """Compiles `src` for every target (in parallel) and parses the reports.
  Returns {target: [KernelReport]}; raises on the first failure."""
  own = workdir is None
  workdir = workdir or tempfile.mkdtemp(prefix="kosmos_hip_")
  try:
    tc = Toolchains(workdir, device_libs)
    for t in targets:  # every missing piece is reported before anything compiles
      tc.check(t)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or len(targets)) as ex:
      futs = {t: ex.submit(compile_tu, t, src, workdir, tc, include_dirs) for t in targets}
      return {t: parse_report(futs[t].result()[0], t, allow_unresolved=not device_libs) for t in targets}
  finally:
    if own:
      shutil.rmtree(workdir, ignore_errors=True)


# ---- bounds -------------------------------------------------------------------


BOUND_FIELDS = ("scratch_bytes", "scratch_ops", "loop_scratch_ops", "calls", "loop_calls")


def read_bounds(path=DEFAULT_BOUNDS):
  """{(target, kernel): (max of each of BOUND_FIELDS)}."""
  bounds = {}
  with open(path) as f:
    for n, ln in enumerate(f, 1):
      ln = ln.split("#", 1)[0].strip()
      if not ln:
        continue
      parts = ln.split()
      if len(parts) != 2 + len(BOUND_FIELDS):
        raise ValueError(f"{path}:{n}: expected 'target kernel {' '.join(BOUND_FIELDS)}', got {ln!r}")
      key = (parts[0], parts[1])
      if key in bounds:
        raise ValueError(f"{path}:{n}: {parts[0]} {parts[1]} is listed twice")
      bounds[key] = tuple(int(x) for x in parts[2:])
  return bounds


def check_bounds(reports, bounds, path=DEFAULT_BOUNDS):
  """Every generated kernel has a bound and stays within it; every bound names a
  generated kernel (for the targets generated). Returns the list of problems."""
  problems = []
  seen = set()
  for target, reps in reports.items():
    for r in reps:
      key = (target, r.name)
      seen.add(key)
      got = [getattr(r, f) for f in BOUND_FIELDS]
      if key not in bounds:
        problems.append(f"{target} {r.name}: no bound in {path} (measured: {target} {r.name} {' '.join(map(str, got))})")
        continue
      for what, g, lim in zip(_BOUND_WORDS, got, bounds[key]):
        if g > lim:
          problems.append(f"{target} {r.name}: {what} {g} > bound {lim} ({path}); callees: {', '.join(r.callees) or 'none'}")
  for key in sorted(set(bounds) - seen):
    if key[0] in reports:
      problems.append(f"{key[0]} {key[1]}: bound in {path} but no such kernel was generated (stale line?)")
  return problems


# ---- output -------------------------------------------------------------------

_BOUND_WORDS = ("scratch bytes/lane", "scratch ops", "scratch ops in loops", "calls (s_swappc_b64)", "calls in loops")
COLUMNS = ("kernel", "target", "VGPR", "AGPR", "SGPR", "LDS B", "scratch B/lane", "scratch ops (in loops)",
           "calls (in loops)", "occupancy", "callees")


def _row(r):
  callees = ", ".join(r.callees) or "–"
  return (r.name, r.target, r.vgprs, r.agprs, r.sgprs, r.lds_bytes, r.scratch_bytes,
          f"{r.scratch_ops} ({r.loop_scratch_ops})", f"{r.calls} ({r.loop_calls})", r.occupancy, callees)


def table(reports, markdown=False):
  rows = [_row(r) for t in reports for r in reports[t]]
  rows.sort(key=lambda x: (x[0], TARGETS.index(x[1]) if x[1] in TARGETS else 9))
  if markdown:
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
  widths = [max(len(str(x)) for x in col) for col in zip(COLUMNS, *rows)]
  fmt = "  ".join(f"{{:<{w}}}" for w in widths)
  return "\n".join([fmt.format(*COLUMNS)] + [fmt.format(*map(str, row)) for row in rows])


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--targets", default=os.environ.get("KOSMOS_HIP_TARGETS", ",".join(TARGETS)),
                  help="comma-separated (default: %(default)s)")
  ap.add_argument("--tu", default=DEFAULT_TU, help="translation unit instantiating the kernels")
  ap.add_argument("--bounds", default=DEFAULT_BOUNDS, help="recorded bounds; 'none' to skip")
  ap.add_argument("--include-root", default=os.path.join(ROOT, "kernels"),
                  help="kernels/ folder to compile against (default: this tree's)")
  ap.add_argument("--markdown", action="store_true", help="print the report as a Markdown table")
  ap.add_argument("--json", help="also write the reports here")
  ap.add_argument("--keep", help="keep the assembly and staged toolchain files in this folder")
  ap.add_argument("--nogpulib", action="store_true",
                  help="compile without the device libraries (the issue's first measurement; implies --bounds none)")
  args = ap.parse_args(argv)
  targets = [t for t in args.targets.split(",") if t]
  incs = [os.path.join(args.include_root, "include"), args.include_root]
  workdir = None
  if args.keep:
    os.makedirs(args.keep, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="run_", dir=args.keep)
  try:
    reports = generate(targets, args.tu, workdir, incs, device_libs=not args.nogpulib)
  except ToolchainMissing as e:
    print(f"hip_check: toolchain missing: {e}", file=sys.stderr)
    return 2
  except (CompileError, CheckFailed) as e:
    print(f"hip_check: FAILED: {e}", file=sys.stderr)
    return 1
  print(table(reports, args.markdown))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({t: [dataclasses.asdict(r) for r in rs] for t, rs in reports.items()}, f, indent=1)
  n = sum(len(v) for v in reports.values())
  if args.nogpulib:
    args.bounds = "none"
  if args.bounds != "none":
    problems = check_bounds(reports, read_bounds(args.bounds), args.bounds)
    if problems:
      print("hip_check: FAILED: resource bounds:\n  " + "\n  ".join(problems), file=sys.stderr)
      return 1
  print(f"hip_check: generated code for {n} kernels on {', '.join(targets)}"
        + ("" if args.bounds == "none" else f"; all within {os.path.relpath(args.bounds, ROOT)}"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
