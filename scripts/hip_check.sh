#!/usr/bin/env bash
# HIP compile check of the single-source device code (DESIGN.md §1): compiles the
# AG+GEMM kernel and the shared headers with hipcc for an MI300-class target,
# syntax only (no ROCm runtime needed). Debian: `apt-get install hipcc` provides it.
# NOT yet run anywhere: hipcc was not installed on the machines of the first session.
set -euo pipefail
HIPCC=${HIPCC:-hipcc}
ARCH=${KOSMOS_HIP_ARCH:-gfx942}
command -v "$HIPCC" >/dev/null || { echo "hip_check: $HIPCC not found (apt-get install hipcc)"; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TU=$(mktemp --suffix=.hip)
trap 'rm -f "$TU"' EXIT
cat > "$TU" <<'SRC'
#include "tp/ag_gemm.cuh"
// Instantiate every dtype the CUDA build does.
template __global__ void kosmos::ag_tn_kernel<float>(const kosmos::AgParams<float>);
template __global__ void kosmos::ag_tn_kernel<kosmos::half_t>(const kosmos::AgParams<kosmos::half_t>);
template __global__ void kosmos::ag_tn_kernel<kosmos::bf16_t>(const kosmos::AgParams<kosmos::bf16_t>);
SRC
"$HIPCC" -std=c++17 --offload-arch="$ARCH" -fsyntax-only -x hip \
  -I "$ROOT/kernels/include" -I "$ROOT/kernels" "$TU"
echo "hip_check: kernels compile for $ARCH"
