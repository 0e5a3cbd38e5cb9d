#!/usr/bin/env python3
"""Machine-code identity of the Hopper (sm_90a) kernels, no GPU needed.

Compiles each sm_90a translation unit of the library (the build's flags, as
scripts/sm90_ptxas_check.sh) to a cubin and prints one hash per kernel: its ELF
`.text.<kernel>` section. Two trees whose hashes agree run the same instructions,
so a refactor that keeps them is a refactor, not a change to measure.

  python3 scripts/sm90_text_hashes.py [--tus ag_tn_sm90,...] [--jobs N] > hashes.txt
  diff before.txt after.txt
  python3 scripts/sm90_text_hashes.py --against /path/to/other/checkout

--against compiles the other tree too and classifies each kernel: identical,
"const offsets" (every differing instruction is a constant load, LDC/ULDC, whose
only difference is its offset: the same code reading, e.g., a timeout message's
string from another place in the constant bank), or differing (with a count).

Needs nvcc and the nvidia-cutlass package (for the CuTe headers).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUS = ["ag_tn_sm90", "tn_rs_sm90", "bulk_ag_nn_sm90", "bulk_rs_nt_sm90",
       "matmul_sm90_tn", "matmul_sm90_nn", "matmul_sm90_nt", "moe_fwd_sm90", "moe_bwd_sm90"]


def text_sections(path: str) -> dict[str, bytes]:
  """{section name: bytes} of an ELF64 little-endian file's `.text.*` sections."""
  data = open(path, "rb").read()
  if data[:4] != b"\x7fELF" or data[4] != 2:
    raise ValueError(f"{path} is not an ELF64 file")
  shoff, = struct.unpack_from("<Q", data, 0x28)
  shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
  heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
  names = heads[shstrndx]
  def name(off):
    start = names[4] + off
    return data[start:data.index(b"\0", start)].decode()
  return {name(h[0]): data[h[4]:h[4] + h[5]] for h in heads if name(h[0]).startswith(".text.")}


# Opcodes (the low 16 bits of an sm_90 instruction) of constant loads.
CONST_LOADS = {0x7B82, 0x7AB9}  # LDC, ULDC


def classify(new: bytes, old: bytes) -> str:
  if new == old:
    return "identical"
  if len(new) != len(old):
    return f"differs ({len(old)} -> {len(new)} bytes)"
  other = 0
  for i in range(0, len(new), 16):
    a, b = new[i:i + 16], old[i:i + 16]
    if a == b:
      continue
    op = int.from_bytes(a[:2], "little")
    if not (op in CONST_LOADS and a[:4] == b[:4] and a[6:] == b[6:]):
      other += 1
  return "const offsets" if other == 0 else f"differs ({other} instructions)"


def compile_tu(tu: str, cute: str, out: str, root: str = ROOT) -> str:
  cubin = os.path.join(out, os.path.basename(root) + "_" + tu + ".cubin")
  cmd = ["nvcc", "-std=c++17", "-O3", "-DNDEBUG", "-DKOSMOS_TIMEOUT_MAILBOX=1", "--expt-relaxed-constexpr",
         "-arch=sm_90a", "-cubin", "-I", cute, "-I", f"{root}/kernels/include", "-I", f"{root}/kernels",
         "-I", f"{root}/csrc", "-o", cubin, f"{root}/csrc/{tu}.cu"]
  r = subprocess.run(cmd, capture_output=True, text=True)
  if r.returncode:
    raise RuntimeError(f"{tu} failed to compile:\n{r.stderr[-4000:]}")
  return cubin


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--tus", default=",".join(TUS), help="comma-separated csrc/<tu>.cu names")
  ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
  ap.add_argument("--against", help="another checkout to compare each kernel's code with")
  args = ap.parse_args()
  import cutlass_library  # noqa: PLC0415 (only this script needs it)
  cute = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")
  tus = [t for t in args.tus.split(",") if t]
  with tempfile.TemporaryDirectory() as out, cf.ThreadPoolExecutor(args.jobs) as pool:
    cubins = dict(zip(tus, pool.map(lambda t: compile_tu(t, cute, out), tus)))
    if args.against:
      other = os.path.abspath(args.against)
      refs = dict(zip(tus, pool.map(lambda t: compile_tu(t, cute, out, other), tus)))
    worst = 0
    for tu in tus:
      ref = text_sections(refs[tu]) if args.against else {}
      for sec, code in sorted(text_sections(cubins[tu]).items()):
        line = f"{tu} {sec[len('.text.'):]} {len(code)} {hashlib.sha256(code).hexdigest()[:16]}"
        if args.against:
          verdict = classify(code, ref[sec]) if sec in ref else "new kernel"
          worst = max(worst, 0 if verdict == "identical" else 1 if verdict == "const offsets" else 2)
          line += f" {verdict}"
        print(line)
  return 2 if worst == 2 else 0


if __name__ == "__main__":
  sys.exit(main())
