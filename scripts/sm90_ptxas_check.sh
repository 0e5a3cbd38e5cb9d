#!/usr/bin/env bash
# ptxas check of the Hopper (sm_90a) kernels, no GPU needed: compiles the
# translation units of the sm_90a library to cubins with the build's flags and
# fails if ptxas serialised any wgmma (info C7510: "wgmma.mma_async instructions
# are serialized"). A single call in a wgmma kernel (printf, a non-inlined
# function) does that silently and cost the fused kernels 11-35% (2026-11-30).
# Run by tests/test_sm90_ptxas.py; needs nvcc and the nvidia-cutlass package.
set -euo pipefail
NVCC=${NVCC:-nvcc}
PY=${PYTHON:-python3}
command -v "$NVCC" >/dev/null || { echo "sm90_ptxas_check: $NVCC not found"; exit 2; }
CUTE=$("$PY" -c "import os, cutlass_library; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))") \
  || { echo "sm90_ptxas_check: nvidia-cutlass is not importable by $PY"; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# The library's TUs (moe_bwd_sm90: the backward's expert GEMMs), and the MoE
# expert GEMMs' standalone check (the grouped GEMM, GEMM1 with its SwiGLU, the
# backward's dgrad and weight gradient).
TUS=(ag_tn_sm90 tn_rs_sm90 matmul_sm90_tn bulk_ag_nn_sm90 bulk_rs_nt_sm90 moe_fwd_sm90 moe_bwd_sm90 grouped grouped_bwd)
src() { case "$1" in grouped*) echo "$ROOT/benchmarks/gemm_standalone/$1.cu" ;; *) echo "$ROOT/csrc/$1.cu" ;; esac; }
for tu in "${TUS[@]}"; do  # the same flags as CMakeLists.txt's kosmos_sm90 library
  "$NVCC" -std=c++17 -O3 -DNDEBUG -DKOSMOS_TIMEOUT_MAILBOX=1 --expt-relaxed-constexpr -arch=sm_90a -cubin \
    -Xptxas -v -I "$CUTE" -I "$ROOT/kernels/include" -I "$ROOT/kernels" -I "$ROOT/csrc" \
    -o "$OUT/$tu.cubin" "$(src "$tu")" > "$OUT/$tu.log" 2>&1 &
done
fail=0
for job in $(jobs -p); do wait "$job" || fail=1; done
for tu in "${TUS[@]}"; do
  if [ "$fail" != 0 ] && [ ! -s "$OUT/$tu.cubin" ]; then echo "sm90_ptxas_check: $tu failed to compile"; tail -30 "$OUT/$tu.log"; exit 1; fi
  if grep -q "C7510" "$OUT/$tu.log"; then
    echo "sm90_ptxas_check: ptxas serialised wgmma in $tu:"; grep "C7510" "$OUT/$tu.log"; exit 1
  fi
  # Spill bytes per kernel, in compile order, for the record (2026-12-01: the
  # push kernels 36-48, from their announce and ready waits, found by taking
  # those out; the pull kernels 12 (AG) and 0 (RS), as before push existed).
  spills=$(grep -o '[0-9]* bytes spill stores' "$OUT/$tu.log" | cut -d' ' -f1 | tr '\n' ' ')
  kernels=$(grep -c 'Compiling entry function' "$OUT/$tu.log")
  echo "$tu: $kernels kernels, no wgmma serialisation; spill stores (bytes): ${spills% }"
done
# To see where spills sit, build a TU with -lineinfo and read it with nvdisasm -gi
# (cuobjdump -sass -fun NAME for one kernel); where the toolkit lacks them, the
# nvidia-cuda-nvdisasm and nvidia-cuda-cuobjdump wheels carry them (nvidia/cu13/bin/).
# Spill bounds on the MoE megakernels' EP = 1 instantiations (kPeers = false, the
# template's last argument: mangled "Lb0EEEv"), the launches the one-GPU benchmarks
# time. When the EP > 1 row copies shared the kernel, ptxas spilled the dispatch
# copy's loads in flight (888 bytes; Qwen3-30B-A3B's forward 1.14x slower, 2026-12-04);
# 220 and 624 bytes since 482cb22 (nvcc 13.0).
spill_bound() {  # TU, kernel name, bound in bytes
  local got
  got=$(awk -v k="$2" '/Compiling entry function/ { hit = index($0, k) && index($0, "Lb0EEEv") }
                       hit && /bytes spill stores/ { for (i = 1; i <= NF; i++) if ($i == "spill") { print $(i - 2); exit } }' \
        "$OUT/$1.log")
  [ -n "$got" ] || { echo "sm90_ptxas_check: no EP = 1 instantiation of $2 in $1"; exit 1; }
  if [ "$got" -gt "$3" ]; then
    echo "sm90_ptxas_check: $2 (EP = 1) spills $got bytes, above its bound of $3: look for a new copy loop or"
    echo "live state in the megakernel (nvdisasm -gi shows where the STL/LDL sit)"; exit 1
  fi
  echo "$2 (EP = 1): $got spill bytes (bound $3)"
}
spill_bound moe_fwd_sm90 moe_fwd_sm90_kernel 320
spill_bound moe_bwd_sm90 moe_bwd_sm90_kernel 768
echo "sm90_ptxas_check: ok"
