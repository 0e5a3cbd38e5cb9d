#!/usr/bin/env python3
"""Machine-code identity of the Hopper (sm_90a) kernels, no GPU needed.

Compiles each sm_90a translation unit of the library (the build's flags, as
scripts/sm90_ptxas_check.sh) to a cubin and prints one hash per kernel: its ELF
`.text.<kernel>` section. Two trees whose hashes agree run the same instructions,
so a refactor that keeps them is a refactor, not a change to measure.

  python3 scripts/sm90_text_hashes.py [--tus ag_tn_sm90,...] [--jobs N] > hashes.txt
  diff before.txt after.txt

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
       "matmul_sm90_tn", "matmul_sm90_nn", "matmul_sm90_nt"]


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


def compile_tu(tu: str, cute: str, out: str) -> str:
  cubin = os.path.join(out, tu + ".cubin")
  cmd = ["nvcc", "-std=c++17", "-O3", "-DNDEBUG", "-DKOSMOS_TIMEOUT_MAILBOX=1", "--expt-relaxed-constexpr",
         "-arch=sm_90a", "-cubin", "-I", cute, "-I", f"{ROOT}/kernels/include", "-I", f"{ROOT}/kernels",
         "-I", f"{ROOT}/csrc", "-o", cubin, f"{ROOT}/csrc/{tu}.cu"]
  r = subprocess.run(cmd, capture_output=True, text=True)
  if r.returncode:
    raise RuntimeError(f"{tu} failed to compile:\n{r.stderr[-4000:]}")
  return cubin


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--tus", default=",".join(TUS), help="comma-separated csrc/<tu>.cu names")
  ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
  args = ap.parse_args()
  import cutlass_library  # noqa: PLC0415 (only this script needs it)
  cute = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")
  tus = [t for t in args.tus.split(",") if t]
  with tempfile.TemporaryDirectory() as out, cf.ThreadPoolExecutor(args.jobs) as pool:
    cubins = dict(zip(tus, pool.map(lambda t: compile_tu(t, cute, out), tus)))
    for tu in tus:
      for sec, code in sorted(text_sections(cubins[tu]).items()):
        print(f"{tu} {sec[len('.text.'):]} {len(code)} {hashlib.sha256(code).hexdigest()[:16]}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
