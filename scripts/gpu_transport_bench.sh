#!/usr/bin/env bash
# Builds and runs the transport benchmark (benchmarks/transport/transport_bench.cu)
# on a machine with >= 2 GPUs (or, with --local 1, one GPU: copies within it);
# the table goes to stdout and $OUT/transport.log.
# Extra arguments go to the benchmark (--gpus N --mib M --reps R --threads T --local 1).
# Peer access only: never NVLink multicast / NVLS (DESIGN.md §4).
set -euo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT" build
nvcc -O3 -std=c++17 -arch=sm_90a -lineinfo -Ikernels/include -Ikernels \
  benchmarks/transport/transport_bench.cu -o build/transport_bench
build/transport_bench "$@" 2>&1 | tee "$OUT/transport.log"
