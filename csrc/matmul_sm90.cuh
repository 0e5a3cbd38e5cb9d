// Definition of sm90_gemm_launch<L> (bf16 operands and output), included by
// exactly one translation unit per layout (csrc/matmul_sm90_{tn,nn,nt}.cu),
// which the standalone driver (benchmarks/gemm_standalone) links too, so both
// run the same configurations.
#pragma once
#include "gemm/elem.h"
#include "gemm/sm90/gemm_kernel.cuh"
#include "matmul_sm90.h"

namespace kosmos {

// The engine configuration of each tile shape, beside its staged output tile:
// 128x256 with 3 stages (211 KB of smem), 128x192 with 4 (213 KB), 128x128
// with 5 (199 KB).
template <gemm::Layout L, sm90::TileShape T>
struct Sm90Config;
template <gemm::Layout L>
struct Sm90Config<L, sm90::TileShape::k128x256> : sm90::TileConfig<L, 128, 256, 3> {};
template <gemm::Layout L>
struct Sm90Config<L, sm90::TileShape::k128x192> : sm90::TileConfig<L, 128, 192, 4> {};
template <gemm::Layout L>
struct Sm90Config<L, sm90::TileShape::k128x128> : sm90::TileConfig<L, 128, 128, 5> {};

template <gemm::Layout L>
cudaError_t sm90_gemm_shape(sm90::TileShape t, const gemm::Problem& p, int grid, cudaStream_t s, int group) {
  using sm90::TileShape;
  using sm90::launch_gemm;
  switch (t) {
    case TileShape::k128x256: return launch_gemm<Sm90Config<L, TileShape::k128x256>, gemm::bf16>(p, grid, s, group);
    case TileShape::k128x192: return launch_gemm<Sm90Config<L, TileShape::k128x192>, gemm::bf16>(p, grid, s, group);
    case TileShape::k128x128: return launch_gemm<Sm90Config<L, TileShape::k128x128>, gemm::bf16>(p, grid, s, group);
  }
  return cudaErrorInvalidValue;
}

// A head and a tail launch split C (and A) at row head_rows: the tail's A and
// C start head_rows rows in, and its A keeps the whole A's leading dimension
// (an MN-major A's rows are its contiguous index). The tail runs after the
// head on the same stream; both write disjoint rows of C.
template <gemm::Layout L>
cudaError_t sm90_gemm_launch(const sm90::Plan& plan, const gemm::Problem& p, int grid, cudaStream_t s) {
  if (plan.head_rows >= p.M) return sm90_gemm_shape<L>(plan.head, p, grid, s, plan.group);
  if (plan.head_rows <= 0 || plan.head_rows % 128 != 0) return cudaErrorInvalidValue;
  gemm::Problem head = p, tail = p;
  head.lda = tail.lda = gemm::leading_dim_a(L, p);
  head.M = plan.head_rows;
  tail.M = p.M - plan.head_rows;
  const size_t rows = static_cast<size_t>(plan.head_rows);
  const size_t a_off = gemm::major_a(L) == gemm::Major::K ? rows * head.lda : rows;  // elements
  tail.a = static_cast<const uint16_t*>(p.a) + a_off;
  tail.c = static_cast<uint16_t*>(p.c) + rows * p.N;
  const cudaError_t e = sm90_gemm_shape<L>(plan.head, head, grid, s, plan.group);
  return e != cudaSuccess ? e : sm90_gemm_shape<L>(plan.tail, tail, grid, s, plan.group);
}

}  // namespace kosmos
