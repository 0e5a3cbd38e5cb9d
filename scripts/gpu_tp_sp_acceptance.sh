#!/usr/bin/env bash
# Issue 6's checks in one device call (nvidia-h200-x2, <= 10 min): build the
# extension, the one-GPU loopback tests, the push-transport GPU tests (push ran
# only in loopback, on one GPU, as of 2026-12-01's session 15), the rest of the
# fused-kernel suites with the time left, then benchmarks/tp_sp.py on every paper shape with the arms that decide the
# bars (XLA, the collective alone for the ceiling, GEMM alone, fused pull, push, push_fold), cut at the budget. At most 8
# files come back from $OUT: env/build/pytest logs, tp_sp.csv, its two plots
# and tp_sp_summary.md. Carry the nvidia-cutlass wheel in .whl/.
#   TESTS=...      pytest selection (default: loopback, the push tests, then the fused suites)
#   SHAPES=all     tp_sp.py --shapes;  ARMS=xla,comm_alone,gemm_alone,kosmos_fused,kosmos_push,kosmos_fold
#   KERNELS=ag_tn,tn_rs;  BUDGET_S=570: a step that would not fit is skipped, and says so
# Never changes clocks or resets a GPU; NVLink multicast stays off.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 KOSMOS_HEAP_MB=${KOSMOS_HEAP_MB:-16384}
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-570}
left() { echo $(( BUDGET_S - SECONDS )); }
TESTS=none bash scripts/gpu_check.sh > /dev/null 2>&1 || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
echo "built at ${SECONDS}s"
FUSED="tests/gpu/test_ag_tn_sm90.py tests/gpu/test_tn_rs_sm90.py tests/gpu/test_multiprocess.py"
run_tests() {  # $1: label, rest: pytest args; stops at the first failure, cut at the budget
  local label=$1; shift
  [ "$(left)" -gt 120 ] || { echo "skipped $label: $(left) s left"; return; }
  KOSMOS_TEST_PLATFORMS=cuda,cpu timeout $(( $(left) - 100 )) $PY -m pytest -q -x -p no:cacheprovider "$@" \
    >> "$OUT/pytest.log" 2>&1
  echo "$label: pytest rc=$? at ${SECONDS}s (124: cut at the budget)"; tail -1 "$OUT/pytest.log"
}
if [ -n "${TESTS:-}" ]; then
  run_tests "tests" $TESTS
else
  run_tests "loopback tests" tests/gpu/test_loopback.py  # ~20 s: every rank on GPU 0 (passed 2026-12-01)
  run_tests "push tests" $FUSED -k push
  run_tests "fused suites" $FUSED -k "not push"
fi
if [ "$(left)" -gt 90 ]; then
  timeout $(( $(left) - 20 )) $PY benchmarks/tp_sp.py --kernels "${KERNELS:-ag_tn,tn_rs}" --shapes "${SHAPES:-all}" \
    --arms "${ARMS:-xla,comm_alone,gemm_alone,kosmos_fused,kosmos_push,kosmos_fold}" --sweep none --budget-s $(( $(left) - 60 )) \
    > "$OUT/tp_sp.log" 2>&1
  echo "tp_sp.py rc=$? at ${SECONDS}s"; grep -E "issue 6 bars|^\| (kosmos|xla|gemm)" "$OUT/tp_sp.log" | head -24
else
  echo "skipped tp_sp.py: $(left) s left"
fi
