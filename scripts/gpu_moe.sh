#!/usr/bin/env bash
# The MoE forward on one GPU in one device call (carry [".whl"]):
#   1. the standalone expert-GEMM checks, SwiGLU GEMM1 included (gpu_bench.sh engine,
#      SHAPES=none; GROUPED=1 also times the floor on the presets), built beside
#   2. the extension (gpu_test.sh), then the MoE GPU tests (TESTS, default
#      tests/gpu/test_moe_fused.py; TESTS=none skips them), then
#   3. benchmarks/moe.py $BENCH_ARGS (BENCH=0 skips it).
# Logs under $OUT/{engine,test}/ and $OUT/bench.log. BUDGET_S bounds the call (default 560).
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
OUT=$OUT/engine SHAPES=none timeout 400 bash scripts/gpu_bench.sh engine > "$OUT/engine.log" 2>&1 &
engine=$!
OUT=$OUT/test TESTS=none bash scripts/gpu_test.sh || exit 1
wait $engine; echo "engine checks rc=$? at ${SECONDS}s"; grep -iE "grouped|swiglu|FAIL|floor" "$OUT/engine.log" | head -40
if ! $PY -c 'import cutlass_library' 2>/dev/null; then export PYTHONPATH=/tmp/kosmos_site${PYTHONPATH:+:$PYTHONPATH}; fi
tests=${TESTS:-tests/gpu/test_moe_fused.py}
if [ "$tests" != none ]; then
  KOSMOS_TEST_PLATFORMS=cuda,cpu timeout $(( $(left) - 60 )) $PY -m pytest -q -x -p no:cacheprovider $tests \
    > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$? at ${SECONDS}s"; tail -25 "$OUT/pytest.log"
fi
if [ "${BENCH:-1}" = 1 ] && [ "$(left)" -gt 40 ]; then
  timeout $(( $(left) - 10 )) $PY benchmarks/moe.py ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  echo "bench rc=$? at ${SECONDS}s"; tail -30 "$OUT/bench.log"
fi
