#!/usr/bin/env bash
# HIP code generation check of the single-source device code (DESIGN.md §1, issue 25):
# compiles every portable kernel (tests/hip/kernels_hip.hip) to AMDGPU assembly for
# gfx90a (MI200; Debian's hipcc 5.2), gfx942 (MI300X) and gfx950 (MI355X) (clang 22 from
# the `ziglang` package, the project's `hip` extra), prints a resource report per kernel
# and target (VGPR, AGPR, LDS, scratch, calls) and fails on a compile error, an
# unresolved call or a kernel beyond its bound in tests/hip/resource_bounds.txt.
# Needs: apt-get install hipcc libamdhip64-dev libclang-common-15-dev rocm-device-libs;
# pip install -e '.[hip]'. Exit 2 when any of it is missing.
# Options go to tests/hip/hip_codegen.py (--help); KOSMOS_HIP_TARGETS picks targets.
# Run by tests/test_hip_compile.py; CI (.ci/run) installs the toolchain for it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
exec "$PY" "$ROOT/tests/hip/hip_codegen.py" "$@"
