#!/usr/bin/env bash
# Issue 5's measurements in one device call (nvidia-h200, <= 10 min): build the
# extension, benchmarks/gemm.py under each of PROTOCOLS (sustained: each arm in
# its own steady state, --settle-s 1.5, ~7 min; interleaved: all arms share one
# sustained power state, ~3 min), ncu of XLA's dot vs ours on one shape, then
# the GPU matmul tests with the time that is left. At most 8 files land in $OUT
# (the device tool returns no more). Carry the nvidia-cutlass wheel in .whl/.
#   PROTOCOLS="sustained"  CAPS=116  LAYOUTS=TN,NN,NT  TILE= (KOSMOS_SM90_TILE for our arm, e.g.
#   128x256c2)  NCU_SHAPES="70B-FC1-MBS1 8B-FC1-MBS4" (TN; the second is our worst)
#   TESTS=tests/gpu/test_matmul.py|none
#   BUDGET_S=570: a step that would not fit is skipped, and says so
# Never changes clocks or resets the GPU; uses no NVLink multicast.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-570}
RUN_TESTS=${TESTS:-tests/gpu/test_matmul.py}
left() { echo $(( BUDGET_S - SECONDS )); }
TESTS=none bash scripts/gpu_check.sh > /dev/null 2>&1 || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
echo "built at ${SECONDS}s"
for proto in ${PROTOCOLS:-sustained}; do
  [ "$(left)" -gt 90 ] || { echo "skipped gemm.py --protocol $proto: $(left) s left"; continue; }
  timeout $(( $(left) - 60 )) $PY benchmarks/gemm.py --caps "${CAPS:-116}" --protocol "$proto" --settle-s 1.5 \
    --layouts "${LAYOUTS:-TN,NN,NT}" ${TILE:+--tile "$TILE"} > "$OUT/gemm_$proto.log" 2>&1
  echo "gemm.py $proto rc=$? at ${SECONDS}s"
  cp benchmarks/out/gemm.csv "$OUT/gemm_$proto.csv" 2>/dev/null
  grep -E "^\| (TN|NN|NT) |^\| 116 |acceptance" "$OUT/gemm_$proto.log"
done
for shape in ${NCU_SHAPES:-70B-FC1-MBS1 8B-FC1-MBS4}; do
  [ "$(left)" -gt 45 ] || { echo "skipped ncu $shape: $(left) s left"; continue; }
  NCU_TIMEOUT=$(( $(left) - 15 )) bash scripts/gpu_gemm_ncu.sh TN "$shape" \
    | grep -E "nvjet|persistent|Duration|dram__bytes|hmma"
done
if [ "$RUN_TESTS" != none ] && [ "$(left)" -gt 30 ]; then
  KOSMOS_TEST_PLATFORMS=cuda,cpu timeout $(left) $PY -m pytest -q -x -p no:cacheprovider $RUN_TESTS \
    > "$OUT/pytest.log" 2>&1; echo "pytest rc=$? at ${SECONDS}s (124: cut at the budget)"; tail -2 "$OUT/pytest.log"
fi
