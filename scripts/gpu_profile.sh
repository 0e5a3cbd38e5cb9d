#!/usr/bin/env bash
# Where the GPU time goes, in one device call each. The first argument picks the view:
#   bash scripts/gpu_profile.sh timelines [ARGS]     per-CTA role timelines of both fused kernels
#       (Chrome-trace JSON + PNG; a KOSMOS_TRACE build, then tests/gpu/test_trace_gpu.py, then
#       scripts/gpu_timelines.py ARGS, e.g. --loopback 2 --arm push_fold on one GPU)
#   bash scripts/gpu_profile.sh rs_phases            (1 GPU) a GEMM+RS builder's time per tile:
#       mainloop, retire + stage, push_fold's combine, copy issue; plus the push_fold kernel's SASS
#   bash scripts/gpu_profile.sh ncu [LAYOUT] [SHAPE] ncu of one call of XLA's dot and one of
#       ops.matmul (default TN 70B-FC1-MBS1; benchmarks/gemm_profile_once.py)
# Output goes to $OUT (default ./out). Each view builds the extension first
# (scripts/gpu_test.sh); SKIP_BUILD=1 uses the one already built.
#   timelines  TESTS=none skips the trace tests
#   rs_phases  ARMS (default push_fold,pull), SHAPES=name:M:K:N,... (K, N per rank)
#   ncu        NCU_TIMEOUT=240
# Never changes clocks (ncu --clock-control none: what each kernel achieves at the clock the
# GPU picks) or resets a GPU; NVLink multicast (NVLS) stays off (DESIGN.md §4).
set -uo pipefail
what=${1:-}; shift || true
case "$what" in timelines|rs_phases|ncu) ;; *) echo "usage:"; sed -n '2,9p' "$0"; exit 2 ;; esac
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); export OUT
cd "$(dirname "$0")/.."
PY=${PY:-python3}

build() {  # $1: 1 for a trace build (kernels record role spans; slower, never for timing)
  [ "${SKIP_BUILD:-0}" = 1 ] && return
  TRACE=$1 TESTS=none bash scripts/gpu_test.sh > /dev/null 2>&1 || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
  echo "built (trace=$1) at ${SECONDS}s"
}

profile_timelines() {
  build 1
  if [ "${TESTS:-}" != none ]; then
    KOSMOS_TEST_PLATFORMS=cuda,cpu $PY -m pytest -q -x -p no:cacheprovider tests/gpu/test_trace_gpu.py \
      > "$OUT/trace_tests.log" 2>&1
    echo "trace tests rc=$?"; tail -1 "$OUT/trace_tests.log"
  fi
  # gpu_timelines.py writes benchmarks/results/timeline_*.{json,png} and copies them to $OUT.
  $PY scripts/gpu_timelines.py "$@" 2>&1 | grep -v "^WARNING"
  return "${PIPESTATUS[0]}"
}

profile_rs_phases() {
  export KOSMOS_TIMEOUT_MS=${KOSMOS_TIMEOUT_MS:-3000}
  local shapes=${SHAPES:-8B-OProj-MBS1:8192:512:4096,70B-OProj-MBS1:8192:1024:8192,70B-Down-MBS1:8192:3584:8192}
  local arms=${ARMS:-push_fold,pull} arm spec name m k n png so
  build 1
  # gpu_timelines.py prints each rank's mean time per tile phase (gemm_rs_sm90.cuh tile_phase),
  # push_fold's combining tiles apart from the others. OUT= : its JSON stay out of $OUT.
  for arm in ${arms//,/ }; do
    for spec in ${shapes//,/ }; do
      IFS=: read -r name m k n <<< "$spec"
      echo "== $name $arm"
      OUT= timeout 120 $PY scripts/gpu_timelines.py --kernels tn_rs --loopback 2 --arm "$arm" --m "$m" --k "$k" \
        --n "$n" --out-dir "/tmp/phases/${name}_$arm" 2>&1 | grep -v "^WARNING" | tail -8
    done
  done 2>&1 | tee "$OUT/phases.log"
  png=$(ls /tmp/phases/*/timeline_*.png 2>/dev/null | head -1); [ -n "$png" ] && cp "$png" "$OUT/"
  # The push_fold kernel's SASS: where its spills sit.
  so=$($PY -c "import kosmos_jax._kosmos_ext as m; print(m.__file__)" 2>/dev/null)
  [ -n "$so" ] && command -v cuobjdump > /dev/null && cuobjdump -sass "$so" > /tmp/all.sass 2>/dev/null \
    && $PY - > "$OUT/fold_kernel.sass" <<'PYEOF'
import re
text = open("/tmp/all.sass").read()
for block in re.split(r"\n(?=\s+Function : )", text):  # one kernel per block
  head = block.strip().splitlines()[0] if block.strip() else ""
  if "tn_rs_sm90_kernel" in head and "Lb1ELb1E" in head:
    print(block)
PYEOF
  ls -la "$OUT"
}

profile_ncu() {
  local L=${1:-TN} shape=${2:-70B-FC1-MBS1} rc
  local metrics=sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum.per_second,dram__bytes_read.sum.per_second,launch__grid_size,launch__cluster_dim_x,launch__cluster_dim_y,launch__shared_mem_per_block_dynamic,launch__registers_per_thread
  build 0
  # --profile-from-start off: gemm_profile_once.py brackets exactly one call of each arm.
  timeout ${NCU_TIMEOUT:-240} ncu --profile-from-start off --clock-control none \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section LaunchStats --section Occupancy --metrics "$metrics" \
    $PY benchmarks/gemm_profile_once.py --layout "$L" --shape "$shape" > "$OUT/ncu_${L}_${shape}.txt" 2>&1
  rc=$?
  grep -E "^  [a-zA-Z_].*\(|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|hmma|per_second|cluster_dim|Registers Per|Grid Size|profiled" \
    "$OUT/ncu_${L}_${shape}.txt" | head -80
  exit $rc
}

case "$what" in
  timelines) profile_timelines "$@" ;;
  rs_phases) profile_rs_phases ;;
  ncu) profile_ncu "$@" ;;
esac
