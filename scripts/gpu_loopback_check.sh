#!/usr/bin/env bash
# Issue 6's work on ONE GPU (nvidia-h200), one device call (<= 10 min): build,
# the loopback tests (every rank of a group a concurrent launch on GPU 0:
# both kernels, both transports, tp 2/4/8), then benchmarks/loopback.py on the
# thin and wide paper shapes, GEMM+RS first (its cost beyond the GEMM is the
# larger). No NVLink in any of it (kosmos_jax/_loopback.py). Back in $OUT: env,
# build and test logs, and per kernel the benchmark's log, CSV and table.
#   RS_SHAPES, AG_SHAPES   paper shape names (empty: skip);  RS_ARMS (default pull,push,push_fold),
#   AG_ARMS (default pull,push); KOSMOS_RS_FOLD_LAG overrides the fold lag rule (csrc/tn_rs_cuda.cu)
#   BUDGET_S=560: the benchmark steps are cut to the time left
#   MATMUL=1: also tests/gpu/test_matmul.py after the loopback tests (an engine change reaches the
#   standalone GEMM too; ~300 s, cut to leave the benchmarks 200 s), so one call validates a branch
# Never changes clocks or resets a GPU; NVLink multicast stays off.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 KOSMOS_TIMEOUT_MS=${KOSMOS_TIMEOUT_MS:-3000}
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-560}
left() { echo $(( BUDGET_S - SECONDS )); }
RS_SHAPES=${RS_SHAPES-8B-OProj-MBS1,8B-Down-MBS1,70B-OProj-MBS1,70B-Down-MBS1,405B-OProj-MBS1,405B-Down-MBS1,8B-Down-MBS4,70B-OProj-MBS4}
AG_SHAPES=${AG_SHAPES-8B-QKV-MBS1,8B-FC1-MBS1,70B-QKV-MBS1,70B-FC1-MBS1,405B-QKV-MBS1,405B-FC1-MBS1,8B-FC1-MBS4,70B-QKV-MBS4}
TESTS=none bash scripts/gpu_check.sh > /dev/null 2>&1 || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
echo "built at ${SECONDS}s"
KOSMOS_TEST_PLATFORMS=cuda,cpu timeout 150 $PY -m pytest -q -x -p no:cacheprovider tests/gpu/test_loopback.py \
  > "$OUT/loopback_tests.log" 2>&1
echo "loopback tests rc=$? at ${SECONDS}s"; tail -1 "$OUT/loopback_tests.log"
grep -E "^FAILED|kosmos timeout|^E  " "$OUT/loopback_tests.log" | head -8
if [ "${MATMUL:-0}" = 1 ] && [ $(( $(left) - 200 )) -gt 30 ]; then
  KOSMOS_TEST_PLATFORMS=cuda,cpu timeout $(( $(left) - 200 )) $PY -m pytest -q -x -p no:cacheprovider tests/gpu/test_matmul.py \
    > "$OUT/matmul_tests.log" 2>&1
  echo "matmul tests rc=$? at ${SECONDS}s (124: cut at the budget)"; tail -1 "$OUT/matmul_tests.log"
  grep -E "^FAILED|^E  " "$OUT/matmul_tests.log" | head -8
fi
bench() {  # $1 kernel, $2 shapes, $3 arms, $4 share of the time left (percent)
  [ -n "$2" ] || { echo "skipped $1: no shapes"; return; }
  local t=$(( $(left) * $4 / 100 ))
  [ "$t" -gt 40 ] || { echo "skipped $1: $(left) s left"; return; }
  timeout "$t" $PY benchmarks/loopback.py --kernels "$1" --shapes "$2" --arms "$3" --budget-s $(( t - 30 )) \
    --tag "_$1" > "$OUT/loopback_$1.log" 2>&1
  echo "$1 rc=$? at ${SECONDS}s (124: cut at the budget)"; grep -E "^$1: " "$OUT/loopback_$1.log" | tail -1
  rm -f "$OUT/loopback_$1.md"  # the log has the table; at most 8 files come back
}
bench tn_rs "$RS_SHAPES" "${RS_ARMS:-pull,push,push_fold}" 50
bench ag_tn "$AG_SHAPES" "${AG_ARMS:-pull,push}" 95
