#!/usr/bin/env bash
# HIP compile check of the single-source device code (DESIGN.md §1): compiles the
# AG+GEMM and GEMM+RS kernels and the shared headers with hipcc for an AMD target (gfx90a by default),
# syntax only (no ROCm runtime needed). Debian: `apt-get install hipcc` provides it.
# Run by tests/test_hip_compile.py; CI installs Debian's hipcc (ROCm 5.2) for it.
set -euo pipefail
HIPCC=${HIPCC:-hipcc}
ARCH=${KOSMOS_HIP_ARCH:-gfx90a}
# hipcc would pick the NVIDIA platform where nvcc exists; this check is for AMD.
export HIP_PLATFORM=${HIP_PLATFORM:-amd}
command -v "$HIPCC" >/dev/null || { echo "hip_check: $HIPCC not found (apt-get install hipcc)"; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TU=$(mktemp --suffix=.hip)
trap 'rm -f "$TU"' EXIT
cat > "$TU" <<'SRC'
#include "tp/ag_gemm.cuh"
#include "tp/gemm_rs.cuh"
// Instantiate every dtype the CUDA build does.
template __global__ void kosmos::ag_tn_kernel<float>(const kosmos::AgParams<float>);
template __global__ void kosmos::ag_tn_kernel<kosmos::half_t>(const kosmos::AgParams<kosmos::half_t>);
template __global__ void kosmos::ag_tn_kernel<kosmos::bf16_t>(const kosmos::AgParams<kosmos::bf16_t>);
template __global__ void kosmos::tn_rs_kernel<float>(const kosmos::RsParams<float>);
template __global__ void kosmos::tn_rs_kernel<kosmos::half_t>(const kosmos::RsParams<kosmos::half_t>);
template __global__ void kosmos::tn_rs_kernel<kosmos::bf16_t>(const kosmos::RsParams<kosmos::bf16_t>);
SRC
"$HIPCC" -std=c++17 --offload-arch="$ARCH" -fsyntax-only -x hip \
  -I "$ROOT/kernels/include" -I "$ROOT/kernels" "$TU"
echo "hip_check: kernels compile for $ARCH"
