#!/usr/bin/env bash
# compute-sanitizer over the Hopper kernels on ONE GPU (nvidia-h200), one device
# call (~4 min): build, then memcheck on ops.matmul (Hopper shapes, 3 layouts)
# and on the loopback fused kernels (GEMM+RS push_fold, AG+GEMM pull and push),
# racecheck on ops.matmul under a CU cap (many tiles per CTA) and on push_fold
# with one CTA per rank. Only kernels named kosmos* are instrumented. Logs
# san_<tool>_<label>.log in $OUT. Known report (2026-12-01, benchmarks/RESULTS.md
# session 20): racecheck flags push_fold's c_loaded read against the producer's
# next write, ordered through the consumers' barrier and c_free (tile_engine.cuh).
# The loopback ranks run concurrently under the sanitizer (seen 2026-12-01), and
# KOSMOS_TIMEOUT_MS=20000 leaves instrumented waits room. Never changes clocks.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 KOSMOS_TIMEOUT_MS=${KOSMOS_TIMEOUT_MS:-20000}
export KOSMOS_TEST_PLATFORMS=cuda,cpu
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PY:-python3}
TESTS=none bash scripts/gpu_check.sh > /dev/null 2>&1 || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
echo "built at ${SECONDS}s"; rm -f "$OUT/build.log" "$OUT/env.log"  # at most 8 files come back
CS="compute-sanitizer --kernel-name kns=kosmos --print-limit ${PRINT_LIMIT:-6}"
san() {  # $1 tool, $2 seconds, $3 label, rest: pytest arguments
  local tool=$1 t=$2 label=$3; shift 3
  timeout "$t" $CS --tool "$tool" $PY -m pytest -q -x -p no:cacheprovider "$@" > "$OUT/san_${tool}_${label}.log" 2>&1
  echo "$tool $label rc=$? at ${SECONDS}s (124: cut)"
  grep -E "SUMMARY|passed|failed|Race reported" "$OUT/san_${tool}_${label}.log" | sort | uniq -c | tail -5
}
san memcheck 110 matmul tests/gpu/test_matmul.py -k "vs_twin and (300x520 or 1000x1032 or 300x130)"
san memcheck 130 loopback "tests/gpu/test_loopback.py::test_tn_rs_fold_tp2" "tests/gpu/test_loopback.py::test_ag_tn_tp2"
san racecheck 90 matmul_cap7 tests/gpu/test_matmul.py -k "cu_cap and TN and 7"
san racecheck 60 fold "tests/gpu/test_loopback.py::test_tn_rs_fold_edges[cta1]" \
  "tests/gpu/test_loopback.py::test_tn_rs_fold_tp2[(512, 1024, 768)]"
