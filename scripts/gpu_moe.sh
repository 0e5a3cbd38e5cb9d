#!/usr/bin/env bash
# The MoE forward on one GPU in one device call (carry [".whl"]):
#   1. the standalone expert-GEMM checks, SwiGLU GEMM1 included (gpu_bench.sh engine,
#      SHAPES=none; GROUPED=1 also times the floor on the presets), built beside
#   2. the extension (gpu_test.sh), then the MoE GPU tests (TESTS, default
#      tests/gpu/test_moe_fused.py; TESTS=none skips them), then
#   3. benchmarks/moe.py $BENCH_ARGS (BENCH=0 skips it), then
#   4. with TIMELINE=PRESET[,PRESET...], a KOSMOS_TRACE rebuild and one traced forward of
#      each (benchmarks/moe.py --timeline: PNG, JSON and each phase's span);
#      TIMELINE_ARGS=--timeline-step traces a training step (both launches) instead.
# ENGINE=0 skips step 1; TEST_RESERVE_S (default 60) is what the tests leave for the rest.
# CLOCKS=1 samples the GPU's SM clock, power and temperature every 200 ms during step 3
# (nvidia-smi, read only) into $OUT/clocks.csv: whether the arms run at the same clocks.
# Logs under $OUT/engine/, $OUT/pytest.log, $OUT/bench.log and $OUT/timeline.log.
# BUDGET_S bounds the call (default 560).
# Never changes clocks or resets a GPU; NVLink multicast stays off (DESIGN.md §4).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=EAGER
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# A hang should fail fast (a wait traps and names its flag), not eat the call.
export KOSMOS_TIMEOUT_MS=${KOSMOS_TIMEOUT_MS:-5000}
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-560}
left() { echo $(( BUDGET_S - SECONDS )); }
if [ "${ENGINE:-1}" = 1 ]; then
  OUT=$OUT/engine SHAPES=none timeout 400 bash scripts/gpu_bench.sh engine > "$OUT/engine.log" 2>&1 &
  engine=$!
fi
OUT=/tmp/moe_build TESTS=none bash scripts/gpu_test.sh || exit 1
if [ "${ENGINE:-1}" = 1 ]; then
  wait $engine; echo "engine checks rc=$? at ${SECONDS}s"; grep -iE "grouped|swiglu|FAIL|floor" "$OUT/engine.log" | head -40
fi
if ! $PY -c 'import cutlass_library' 2>/dev/null; then export PYTHONPATH=/tmp/kosmos_site${PYTHONPATH:+:$PYTHONPATH}; fi
tests=${TESTS:-tests/gpu/test_moe_fused.py}
if [ "$tests" != none ]; then
  KOSMOS_TEST_PLATFORMS=cuda,cpu timeout $(( $(left) - ${TEST_RESERVE_S:-60} )) $PY -m pytest -q -p no:cacheprovider $tests \
    > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$? at ${SECONDS}s"; tail -25 "$OUT/pytest.log"
fi
if [ "${BENCH:-1}" = 1 ] && [ "$(left)" -gt 40 ]; then
  if [ "${CLOCKS:-0}" = 1 ]; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 200 \
      > "$OUT/clocks.csv" 2>&1 &
    clocks=$!
  fi
  OUT= timeout $(( $(left) - 10 )) $PY benchmarks/moe.py ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1  # its table is in the log
  echo "bench rc=$? at ${SECONDS}s"; tail -30 "$OUT/bench.log"
  if [ "${CLOCKS:-0}" = 1 ]; then kill $clocks 2>/dev/null; wait $clocks 2>/dev/null; fi
fi
if [ -n "${TIMELINE:-}" ] && [ "$(left)" -gt 120 ]; then
  OUT=/tmp/moe_build TRACE=1 TESTS=none bash scripts/gpu_test.sh || exit 1
  for preset in ${TIMELINE//,/ }; do
    timeout $(( $(left) - 10 )) $PY benchmarks/moe.py --timeline "$preset" --routing balanced ${TIMELINE_ARGS:-} \
      >> "$OUT/timeline.log" 2>&1
    echo "timeline $preset rc=$? at ${SECONDS}s"
  done
  grep -v "^WARNING" "$OUT/timeline.log" | tail -30
fi
