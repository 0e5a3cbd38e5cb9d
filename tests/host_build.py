"""Compiles the host drivers in tests/host/ against the device headers with the
host C++ compiler: how the CPU runs the kernels' scheduling code (DESIGN.md §6)."""
import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CXX = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def build(tmp_path, source: str, *extra_flags: str, name: str = "emu") -> str:
  """Compile tests/host/<source> (warnings are errors); returns the executable's path."""
  assert CXX is not None, "no host C++ compiler (g++/c++/clang++) found"
  exe = str(tmp_path / name)
  cmd = [CXX, "-std=c++17", "-O1", "-pthread", "-Wall", "-Wextra", "-Werror", *extra_flags,
         "-I", os.path.join(ROOT, "kernels", "include"), "-I", os.path.join(ROOT, "kernels"),
         os.path.join(ROOT, "tests", "host", source), "-o", exe]
  r = subprocess.run(cmd, capture_output=True, text=True)
  assert r.returncode == 0, f"compile failed: {' '.join(cmd)}\n{r.stderr}"
  return exe
