#!/usr/bin/env bash
# The GPU benchmarks, each in one device call (<= 10 min). The first argument picks one:
#   bash scripts/gpu_bench.sh loopback        (1 GPU)  the fused kernels' cost beyond their GEMM, every
#                                               rank a concurrent launch on one GPU (no NVLink in it)
#   bash scripts/gpu_bench.sh gemm            (1 GPU)  ops.matmul vs XLA's dot, ncu of one call each,
#                                               then the GPU matmul tests
#   bash scripts/gpu_bench.sh engine          (1 GPU)  the standalone tile-engine check, then its
#                                               benchmark vs cublasGemmEx (no extension build)
#   bash scripts/gpu_bench.sh tp_sp           (2+ GPUs) the fused kernels' GPU tests, then
#                                               benchmarks/tp_sp.py: fused vs XLA on the paper shapes
#   bash scripts/gpu_bench.sh transport [ARGS] (2+ GPUs; --local 1: one) push/pull GB/s vs CTA count
# Logs, CSVs and tables go to $OUT (default ./out). The device tool returns at most 8
# files, so each step keeps its files few. BUDGET_S bounds the whole call: a step that
# would not fit is skipped or cut, and says so, so the logs of what ran still come back.
# Knobs per benchmark (environment):
#   loopback   RS_SHAPES, AG_SHAPES  paper shape names (empty: skip that kernel);
#              RS_ARMS (default pull,push,push_fold), AG_ARMS (default pull,push);
#              KOSMOS_RS_FOLD_LAG  overrides push_fold's lag rule (csrc/tn_rs_cuda.cu);
#              TESTS=none  skips the loopback tests run first;  MATMUL=1  also runs
#              tests/gpu/test_matmul.py (an engine change reaches the standalone GEMM too)
#   gemm       PROTOCOLS (default sustained; also interleaved, blocks), CAPS=116,
#              LAYOUTS=TN,NN,NT, TILE (KOSMOS_SM90_TILE for our arm, e.g. 128x192),
#              NCU_SHAPES="70B-FC1-MBS1 8B-FC1-MBS4" (TN), TESTS=tests/gpu/test_matmul.py|none
#   engine     SHAPES=quick|all|none, ALL_TILES=1 (every tile shape alone), BENCH_TIMEOUT=300,
#              GROUPED=1 (also time the MoE expert GEMMs and weight gradients on the presets:
#              the MoE floors),
#              CUTLASS_INCLUDE=DIR (default: the nvidia-cutlass package, or the wheel in .whl/),
#              BUILD_DIR=build/gemm_standalone
#   tp_sp      TESTS=... (default: loopback, the push tests, then the fused suites), SHAPES=all,
#              ARMS=xla,comm_alone,gemm_alone,kosmos_fused,kosmos_push,kosmos_fold, KERNELS=ag_tn,tn_rs
#   transport  ARGS go to the benchmark: --gpus N --mib M --reps R --threads T --local 1
# Never changes clocks or resets a GPU; NVLink multicast (NVLS) stays off (DESIGN.md §4).
set -uo pipefail
what=${1:-}; shift || true
case "$what" in loopback|gemm|engine|tp_sp|transport) ;; *) echo "usage:"; sed -n '2,11p' "$0"; exit 2 ;; esac
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); export OUT
cd "$(dirname "$0")/.."
PY=${PY:-python3}
BUDGET_GIVEN=${BUDGET_S:-}
BUDGET_S=${BUDGET_S:-570}
left() { echo $(( BUDGET_S - SECONDS )); }

build() {  # the extension, through the GPU test script (TESTS=none: build only)
  TESTS=none bash scripts/gpu_test.sh > /dev/null 2>&1 || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
  echo "built at ${SECONDS}s"
}

pytest_gpu() {  # $1 seconds, $2 log, rest: pytest args; stops at the first failure
  local t=$1 log=$2; shift 2
  KOSMOS_TEST_PLATFORMS=cuda,cpu timeout "$t" $PY -m pytest -q -x -p no:cacheprovider "$@" >> "$log" 2>&1
}

bench_loopback() {
  # Loopback waits are short: a hang should fail fast, not eat the budget.
  export KOSMOS_TIMEOUT_MS=${KOSMOS_TIMEOUT_MS:-3000}
  BUDGET_S=${BUDGET_GIVEN:-560}
  local rs=${RS_SHAPES-8B-OProj-MBS1,8B-Down-MBS1,70B-OProj-MBS1,70B-Down-MBS1,405B-OProj-MBS1,405B-Down-MBS1,8B-Down-MBS4,70B-OProj-MBS4}
  local ag=${AG_SHAPES-8B-QKV-MBS1,8B-FC1-MBS1,70B-QKV-MBS1,70B-FC1-MBS1,405B-QKV-MBS1,405B-FC1-MBS1,8B-FC1-MBS4,70B-QKV-MBS4}
  build
  if [ "${TESTS:-}" != none ]; then
    pytest_gpu 150 "$OUT/loopback_tests.log" tests/gpu/test_loopback.py
    echo "loopback tests rc=$? at ${SECONDS}s"; tail -1 "$OUT/loopback_tests.log"
    grep -E "^FAILED|kosmos timeout|^E  " "$OUT/loopback_tests.log" | head -8
  fi
  # The matmul tests take ~300 s: cut them to leave the benchmarks 200 s.
  if [ "${MATMUL:-0}" = 1 ] && [ $(( $(left) - 200 )) -gt 30 ]; then
    pytest_gpu $(( $(left) - 200 )) "$OUT/matmul_tests.log" tests/gpu/test_matmul.py
    echo "matmul tests rc=$? at ${SECONDS}s (124: cut at the budget)"; tail -1 "$OUT/matmul_tests.log"
    grep -E "^FAILED|^E  " "$OUT/matmul_tests.log" | head -8
  fi
  # GEMM+RS first: its cost beyond the GEMM is the larger, so it gets half the time left.
  loopback_kernel tn_rs "$rs" "${RS_ARMS:-pull,push,push_fold}" 50
  loopback_kernel ag_tn "$ag" "${AG_ARMS:-pull,push}" 95
}

loopback_kernel() {  # $1 kernel, $2 shapes, $3 arms, $4 share of the time left (percent)
  [ -n "$2" ] || { echo "skipped $1: no shapes"; return; }
  local t=$(( $(left) * $4 / 100 ))
  [ "$t" -gt 40 ] || { echo "skipped $1: $(left) s left"; return; }
  timeout "$t" $PY benchmarks/loopback.py --kernels "$1" --shapes "$2" --arms "$3" --budget-s $(( t - 30 )) \
    --tag "_$1" > "$OUT/loopback_$1.log" 2>&1
  echo "$1 rc=$? at ${SECONDS}s (124: cut at the budget)"; grep -E "^$1: " "$OUT/loopback_$1.log" | tail -1
  rm -f "$OUT/loopback_$1.md"  # the log has the table; few files come back
}

bench_gemm() {
  local tests=${TESTS:-tests/gpu/test_matmul.py}
  build
  # sustained: each arm in its own steady state (~7 min); interleaved: one shared power state (~3 min).
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
    SKIP_BUILD=1 NCU_TIMEOUT=$(( $(left) - 15 )) bash scripts/gpu_profile.sh ncu TN "$shape" \
      | grep -E "nvjet|persistent|Duration|dram__bytes|hmma"
  done
  if [ "$tests" != none ] && [ "$(left)" -gt 30 ]; then
    pytest_gpu "$(left)" "$OUT/pytest.log" $tests
    echo "pytest rc=$? at ${SECONDS}s (124: cut at the budget)"; tail -2 "$OUT/pytest.log"
  fi
}

bench_engine() {
  # Builds only the standalone driver (benchmarks/gemm_standalone) against the library's own
  # sm_90a configurations; env.log, check.log and bench.log go to $OUT, build logs to $BUILD_DIR/logs.
  local shapes=${SHAPES:-quick} build=${BUILD_DIR:-build/gemm_standalone} src=benchmarks/gemm_standalone
  local logs=$build/logs; mkdir -p "$logs"
  if [ -z "${CUTLASS_INCLUDE:-}" ]; then
    if ! $PY -c "import cutlass_library" 2>/dev/null && ls .whl/nvidia_cutlass*.whl >/dev/null 2>&1; then
      $PY -m pip install -q --no-index --no-deps --target /tmp/kosmos_site .whl/nvidia_cutlass*.whl
      export PYTHONPATH=/tmp/kosmos_site${PYTHONPATH:+:$PYTHONPATH}
    fi
    CUTLASS_INCLUDE=$($PY -c "import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))")/source/include
  fi
  [ -d "$CUTLASS_INCLUDE/cute" ] || { echo "no CuTe headers at $CUTLASS_INCLUDE"; exit 1; }
  # -gencode form: the -arch=sm_90a shorthand also runs a plain sm_90 pass that rejects wgmma.
  local flags="-gencode=arch=compute_90a,code=sm_90a -std=c++17 --expt-relaxed-constexpr -O3 -Xptxas -v
       -I$CUTLASS_INCLUDE -Ikernels -Ikernels/include -Icsrc"
  local t0 pids=() fail=0 f n p
  t0=$(date +%s)
  rm -f "$build"/*.o
  # The bf16 Hopper configurations are the library's own translation units: it times what ops.matmul runs.
  for f in $src/main $src/bench $src/portable $src/sm90_f32 $src/grouped $src/grouped_bwd csrc/matmul_sm90_tn \
      csrc/matmul_sm90_nn csrc/matmul_sm90_nt; do
    n=$(basename $f)
    nvcc $flags -c $f.cu -o "$build/$n.o" > "$logs/build_$n.log" 2>&1 & pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p || fail=1; done
  if [ $fail = 1 ]; then echo "BUILD FAILED"; grep -h -B2 -A8 "error" "$logs"/build_*.log | head -80; exit 1; fi
  nvcc -gencode=arch=compute_90a,code=sm_90a "$build"/*.o -lcublas -o "$build/gemm_bench" > "$logs/build_link.log" 2>&1 \
    || { echo "LINK FAILED"; cat "$logs/build_link.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
  grep -h "registers\|stack\|C75" "$logs"/build_*sm90_*.log | sort | uniq -c
  nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/env.log" 2>&1
  timeout 180 "$build/gemm_bench" check 2>&1 | tee "$OUT/check.log"
  local check_rc=${PIPESTATUS[0]}
  # The MoE expert GEMMs on every preset's balanced rows (the MoE benchmark's floor) and the
  # backward's dgrads and weight gradients.
  [ "${GROUPED:-0}" = 1 ] && timeout $(( $(left) - 10 )) "$build/gemm_bench" bench-grouped 2>&1 | tee "$OUT/grouped.log"
  [ "$shapes" = none ] && exit $check_rc
  # Paper shapes in engine terms (C[M,N], contraction K); quick = MBS1 and MBS2 only.
  if [ "$shapes" = quick ]; then grep -E "MBS[12] " $src/paper_shapes.txt; else cat $src/paper_shapes.txt; fi > "$build/shapes.txt"
  timeout ${BENCH_TIMEOUT:-300} "$build/gemm_bench" bench "$build/shapes.txt" ${ALL_TILES:+all-tiles} 2>&1 | tee "$OUT/bench.log"
  exit $check_rc
}

bench_tp_sp() {
  # The MBS8 shapes' staging needs a large symmetric heap.
  export KOSMOS_HEAP_MB=${KOSMOS_HEAP_MB:-16384}
  local fused="tests/gpu/test_ag_tn_sm90.py tests/gpu/test_tn_rs_sm90.py tests/gpu/test_multiprocess.py"
  build
  if [ -n "${TESTS:-}" ]; then
    tp_sp_tests "tests" $TESTS
  else
    tp_sp_tests "loopback tests" tests/gpu/test_loopback.py  # ~20 s: every rank on GPU 0
    tp_sp_tests "push tests" $fused -k push                  # push has run only in loopback so far
    tp_sp_tests "fused suites" $fused -k "not push"
  fi
  if [ "$(left)" -gt 90 ]; then
    timeout $(( $(left) - 20 )) $PY benchmarks/tp_sp.py --kernels "${KERNELS:-ag_tn,tn_rs}" --shapes "${SHAPES:-all}" \
      --arms "${ARMS:-xla,comm_alone,gemm_alone,kosmos_fused,kosmos_push,kosmos_fold}" --sweep none \
      --budget-s $(( $(left) - 60 )) > "$OUT/tp_sp.log" 2>&1
    local rc=$?
    echo "tp_sp.py rc=$rc at ${SECONDS}s"; grep -E "issue 6 bars|^\| (kosmos|xla|gemm)" "$OUT/tp_sp.log" | head -24
    return $rc
  fi
  echo "skipped tp_sp.py: $(left) s left"
}

tp_sp_tests() {  # $1 label, rest: pytest args; leaves the benchmark 100 s
  local label=$1; shift
  [ "$(left)" -gt 120 ] || { echo "skipped $label: $(left) s left"; return; }
  pytest_gpu $(( $(left) - 100 )) "$OUT/pytest.log" "$@"
  echo "$label: pytest rc=$? at ${SECONDS}s (124: cut at the budget)"; tail -1 "$OUT/pytest.log"
}

bench_transport() {
  # A standalone CUDA program over kernels/include/kosmos/transport.h: no extension build.
  mkdir -p build
  nvcc -O3 -std=c++17 -arch=sm_90a -lineinfo -Ikernels/include -Ikernels \
    benchmarks/transport/transport_bench.cu -o build/transport_bench || { echo "BUILD FAILED"; exit 1; }
  build/transport_bench "$@" 2>&1 | tee "$OUT/transport.log"
  exit "${PIPESTATUS[0]}"
}

case "$what" in
  loopback) bench_loopback ;;
  gemm) bench_gemm ;;
  engine) bench_engine ;;
  tp_sp) bench_tp_sp ;;
  transport) bench_transport "$@" ;;
esac
