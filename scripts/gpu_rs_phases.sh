#!/usr/bin/env bash
# Where a GEMM+RS builder's time goes, per tile, on ONE GPU (loopback ranks):
# a KOSMOS_TRACE build, then scripts/gpu_timelines.py --loopback 2 on thin- and
# wide-K paper shapes; it prints each rank's mean mainloop / retire+stage /
# combine / copy-issue time per tile (gemm_rs_sm90.cuh tile_phase), combining
# (push_fold's own chunk) and other tiles apart. Also the SASS of the push_fold
# kernel (where its spills sit). Back in $OUT: the log, one PNG, the SASS.
#   ARMS (default push_fold,pull)   SHAPES: name:M:K:N,... (K, N per rank)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 KOSMOS_TIMEOUT_MS=${KOSMOS_TIMEOUT_MS:-3000}
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PY:-python3}
SHAPES=${SHAPES:-8B-OProj-MBS1:8192:512:4096,70B-OProj-MBS1:8192:1024:8192,70B-Down-MBS1:8192:3584:8192}
TRACE=1 TESTS=none bash scripts/gpu_check.sh > /dev/null 2>&1 || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
echo "built (trace) at ${SECONDS}s"
for arm in ${ARMS:-push_fold pull}; do
  for spec in ${SHAPES//,/ }; do
    IFS=: read -r name m k n <<< "$spec"
    echo "== $name $arm"
    OUT= timeout 120 $PY scripts/gpu_timelines.py --kernels tn_rs --loopback 2 --arm "$arm" --m "$m" --k "$k" --n "$n" \
      --out-dir "/tmp/phases/${name}_$arm" 2>&1 | grep -v "^WARNING" | tail -8
  done
done 2>&1 | tee "$OUT/phases.log"
png=$(ls /tmp/phases/*/timeline_*.png 2>/dev/null | head -1); [ -n "$png" ] && cp "$png" "$OUT/"
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
