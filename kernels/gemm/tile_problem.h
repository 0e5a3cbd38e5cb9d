// What a tile engine computes, independent of arch: one GEMM problem in the
// engine's own terms (C[M,N] = sum_k A(m,k) B(n,k), fp32 accumulation) plus the
// map from the three row-major JAX layouts of `ops.matmul` onto it. Plain C++
// so host code, the CPU emulation and both engines share one definition.
#pragma once
#include <cstdint>

#include "kosmos/platform.h"

namespace kosmos::gemm {

// The training pass a product belongs to (kosmos_jax/reference/matmul.py).
//   TN fprop: C[m,n] = a[m,k] @ b[k,n]      engine M=m, N=n, K=k
//   NN dgrad: C[m,k] = a[m,n] @ b[k,n]^T    engine M=m, N=k, K=n
//   NT wgrad: C[k,n] = a[m,k]^T @ b[m,n]    engine M=k, N=n, K=m
enum class Layout : int { TN = 0, NN = 1, NT = 2 };

// Which index of an operand is contiguous in memory. An engine needs this, not
// the layout name: wgmma and TMA take K-major and MN-major tiles alike.
enum class Major : int { K = 0, MN = 1 };

KOSMOS_HD constexpr Major major_a(Layout l) { return l == Layout::NT ? Major::MN : Major::K; }
KOSMOS_HD constexpr Major major_b(Layout l) { return l == Layout::NN ? Major::K : Major::MN; }

// Row-major operands, so the leading dimension is the extent of the contiguous
// index: K for a K-major operand, M (for A) or N (for B) otherwise. The one
// exception is lda: a launch over a band of A's rows (sm90::Plan's tail) keeps
// the whole A's leading dimension; only the Hopper engine honours it.
struct Problem {
  const void* a;  // A(m,k): element at a[m*lda + k] (K-major) or a[k*lda + m] (MN-major)
  const void* b;  // B(n,k): element at b[n*K + k] (K-major) or b[k*N + n] (MN-major)
  void* c;        // C(m,n) at c[m*N + n], row-major, rounded once to the output type
  int M, N, K;
  int lda = 0;  // 0: packed (K for K-major A, M for MN-major A)
};

KOSMOS_HD constexpr int leading_dim_a(Layout l, const Problem& p) {
  return p.lda > 0 ? p.lda : major_a(l) == Major::K ? p.K : p.M;
}

// A tile's position in units of tiles (not elements).
struct TileCoord {
  int m, n;
};

KOSMOS_HD constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace kosmos::gemm
