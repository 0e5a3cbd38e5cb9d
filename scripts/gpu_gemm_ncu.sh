#!/usr/bin/env bash
# ncu of XLA's dot (cuBLAS) against kosmos_matmul, one call each, on one paper shape
# (scripts/gemm_profile_once.py). Clocks left alone (--clock-control none): the
# question is what each kernel achieves at the clock the GPU chooses. Needs the
# extension built (scripts/gpu_check.sh with TESTS=none). Writes $OUT/ncu_<L>_<shape>.txt.
#   bash scripts/gpu_gemm_ncu.sh [LAYOUT] [SHAPE]      default TN 70B-FC1-MBS1
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PY:-python3}
L=${1:-TN}; SHAPE=${2:-70B-FC1-MBS1}
METRICS=sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum.per_second,dram__bytes_read.sum.per_second,launch__grid_size,launch__cluster_dim_x,launch__cluster_dim_y,launch__shared_mem_per_block_dynamic,launch__registers_per_thread
timeout ${NCU_TIMEOUT:-240} ncu --profile-from-start off --clock-control none \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section LaunchStats --section Occupancy --metrics "$METRICS" \
  $PY scripts/gemm_profile_once.py --layout "$L" --shape "$SHAPE" > "$OUT/ncu_${L}_${SHAPE}.txt" 2>&1
rc=$?
grep -E "^  [a-zA-Z_].*\(|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|hmma|per_second|cluster_dim|Registers Per|Grid Size|profiled" \
  "$OUT/ncu_${L}_${SHAPE}.txt" | head -80
exit $rc
