#!/usr/bin/env bash
# Build the extension on a GPU host and run the GPU tests (tests/gpu by default).
#   bash scripts/gpu_test.sh [pytest args]
#   TESTS="tests/gpu/test_matmul.py ..."   pick test files;  TESTS=none: build only
#   TRACE=1   build with KOSMOS_TRACE=ON (kernels record role timelines for
#             kosmos_jax.trace.capture and scripts/gpu_timelines.py)
#   OUT=DIR   where env.log, build.log and pytest.log go (default ./out)
#   PY=python3
# The other gpu_*.sh scripts build through this one (TESTS=none).
# Never enables NVLink multicast (NVLS): on shared hosts it can take GPUs out of service (DESIGN.md §4).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# EAGER: a lazy module load while a persistent kernel spins can deadlock (DESIGN.md §4).
export PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=EAGER
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${PY:-python3}
# The GPUs, the link topology and the toolchain, so a log says what it ran on.
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv; nvidia-smi topo -m; nvcc --version | tail -2
  $PY -c 'import jax; print("jax", jax.__version__, jax.devices())'; } > "$OUT/env.log" 2>&1
# The GPU host has no package index: the CuTe headers (nvidia-cutlass) come from a
# wheel carried in .whl/ when they are not installed.
if ! $PY -c 'import cutlass_library' 2>/dev/null; then
  ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1 || { echo "nvidia-cutlass missing: carry its wheel in .whl/"; exit 1; }
  $PY -m pip install -q --no-index --no-deps --target /tmp/kosmos_site .whl/nvidia_cutlass-*.whl
  export PYTHONPATH=/tmp/kosmos_site${PYTHONPATH:+:$PYTHONPATH}
fi
t0=$(date +%s)
# --no-build-isolation: no index to fetch build requirements from; build against what is installed.
$PY -m pip install --no-build-isolation --no-deps -e . -Ccmake.define.KOSMOS_CUDA=on \
  -Ccmake.define.KOSMOS_TRACE="$([ "${TRACE:-0}" = 1 ] && echo ON || echo OFF)" > "$OUT/build.log" 2>&1 \
  || { echo "BUILD FAILED"; tail -60 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
[ "${TESTS:-}" = none ] && exit 0
KOSMOS_TEST_PLATFORMS=cuda,cpu $PY -m pytest -q -x -p no:cacheprovider ${TESTS:-tests/gpu} "$@" 2>&1 | tee "$OUT/pytest.log"
