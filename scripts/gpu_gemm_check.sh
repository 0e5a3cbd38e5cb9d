#!/usr/bin/env bash
# Build the standalone tile-GEMM driver (benchmarks/gemm_standalone) with nvcc
# for sm_90a, check the Hopper engine against the portable oracle, then time it
# against cuBLAS. env.log, check.log and bench.log go to $OUT (or ./out): the
# device tool returns at most 8 files; build logs stay in $BUILD/logs.
#   SHAPES=quick|all|none   which of the paper's shapes to time (default quick)
#   ALL_TILES=1             also time every tile shape alone (the wave model's fit)
#   CUTLASS_INCLUDE=DIR     CuTe/CUTLASS headers; default: the nvidia-cutlass
#                           package (installed from .whl/ when not importable)
# Never changes clocks or resets the GPU; uses no NVLink multicast.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PY:-python3}
SHAPES=${SHAPES:-quick}
BUILD=${BUILD:-build/gemm_standalone}; LOGS=$BUILD/logs; mkdir -p "$LOGS"
SRC=benchmarks/gemm_standalone

if [ -z "${CUTLASS_INCLUDE:-}" ]; then
  if ! $PY -c "import cutlass_library" 2>/dev/null && ls .whl/nvidia_cutlass*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/nvidia_cutlass*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
  fi
  CUTLASS_INCLUDE=$($PY -c "import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))")/source/include
fi
[ -d "$CUTLASS_INCLUDE/cute" ] || { echo "no CuTe headers at $CUTLASS_INCLUDE"; exit 1; }

# -gencode form: the -arch=sm_90a shorthand also runs a plain sm_90 pass that rejects wgmma (HOPPER.md).
FLAGS="-gencode=arch=compute_90a,code=sm_90a -std=c++17 --expt-relaxed-constexpr -O3 -Xptxas -v
       -I$CUTLASS_INCLUDE -Ikernels -Ikernels/include -Icsrc"
t0=$(date +%s)
pids=()
rm -f $BUILD/*.o
# The bf16 Hopper configurations are the library's own translation units.
for f in $SRC/main $SRC/bench $SRC/portable $SRC/sm90_f32 csrc/matmul_sm90_tn csrc/matmul_sm90_nn csrc/matmul_sm90_nt; do
  n=$(basename $f)
  nvcc $FLAGS -c $f.cu -o $BUILD/$n.o > "$LOGS/build_$n.log" 2>&1 & pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait $p || fail=1; done
if [ $fail = 1 ]; then echo "BUILD FAILED"; grep -h -B2 -A8 "error" "$LOGS"/build_*.log | head -80; exit 1; fi
nvcc -gencode=arch=compute_90a,code=sm_90a $BUILD/*.o -lcublas -o $BUILD/gemm_bench > "$LOGS/build_link.log" 2>&1 \
  || { echo "LINK FAILED"; cat "$LOGS/build_link.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
grep -h "registers\|stack\|C75" "$LOGS"/build_*sm90_*.log | sort | uniq -c

nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/env.log" 2>&1
timeout 180 $BUILD/gemm_bench check 2>&1 | tee "$OUT/check.log"
check_rc=${PIPESTATUS[0]}
[ "$SHAPES" = none ] && exit $check_rc

# Paper shapes in engine terms (C[M,N], contraction K); quick = MBS1 and MBS2 only.
if [ "$SHAPES" = quick ]; then grep -E "MBS[12] " $SRC/paper_shapes.txt; else cat $SRC/paper_shapes.txt; fi > "$BUILD/shapes.txt"
timeout ${BENCH_TIMEOUT:-300} $BUILD/gemm_bench bench "$BUILD/shapes.txt" ${ALL_TILES:+all-tiles} 2>&1 | tee "$OUT/bench.log"
exit $check_rc
