#!/usr/bin/env bash
# Build the extension on a GPU machine and run the GPU tests; logs go to $OUT (or ./out).
# Never enables NVLink multicast (NVLS): see DESIGN.md §4.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=EAGER
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PY:-python3}
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv; nvidia-smi topo -m; nvcc --version | tail -2
  $PY -c 'import jax; print("jax", jax.__version__, jax.devices())'; } > "$OUT/env.log" 2>&1
# The GPU host has no package index: CuTe headers (nvidia-cutlass) come from a
# carried wheel in .whl/ when they are not installed (see the device README).
if ! $PY -c 'import cutlass_library' 2>/dev/null; then
  ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1 || { echo "nvidia-cutlass missing: carry its wheel in .whl/"; exit 1; }
  $PY -m pip install -q --no-index --no-deps --target /tmp/kosmos_site .whl/nvidia_cutlass-*.whl
  export PYTHONPATH=/tmp/kosmos_site${PYTHONPATH:+:$PYTHONPATH}
fi
t0=$(date +%s)
# TRACE=1: kernels record role timelines (kosmos_jax.trace.capture, scripts/gpu_timelines.py).
$PY -m pip install --no-build-isolation --no-deps -e . -Ccmake.define.KOSMOS_CUDA=on \
  -Ccmake.define.KOSMOS_TRACE="$([ "${TRACE:-0}" = 1 ] && echo ON || echo OFF)" > "$OUT/build.log" 2>&1 \
  || { echo "BUILD FAILED"; tail -60 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
[ "${TESTS:-}" = none ] && exit 0  # TESTS=none: build only
KOSMOS_TEST_PLATFORMS=cuda,cpu $PY -m pytest -q -x -p no:cacheprovider ${TESTS:-tests/gpu} "$@" 2>&1 | tee "$OUT/pytest.log"
