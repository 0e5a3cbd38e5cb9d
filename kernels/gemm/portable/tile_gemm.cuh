// Portable SIMT tile engine: one 128x128 output tile of A[rows,K] @ W[K,N] with
// fp32 accumulation, 256 threads, each owning an 8x8 strided sub-block. No tensor
// cores: it is the correctness baseline every arch can run (the Hopper engine
// lives in gemm/sm90/). A's rows arrive through peers, so they are read with
// L2-only loads; W is read-only for the kernel's lifetime.
#pragma once
#include <cstdint>

#include "kosmos/platform.h"
#include "kosmos/types.h"

namespace kosmos::portable {

constexpr int kBM = 128, kBN = 128, kBK = 16;
constexpr int kThreads = 256;
constexpr int kSub = 8;  // per-thread sub-block is kSub x kSub

struct TileSmem {
  float a[kBK][kBM];  // A tile, k-major so a column of 8 rows is a broadcast
  float w[kBK][kBN];
};

struct Acc {
  float v[kSub][kSub];
};

// acc = A[0:rows, :] @ W[:, n0:n0+kBN]; rows <= kBM, columns past N read as 0.
// kWT: W is stored transposed, [N, K] row-major (the NN / dgrad layout: dX =
// dY @ w.T with w [k, n]); its staging walks k fastest so loads coalesce.
template <typename T, bool kWT = false>
KOSMOS_DEVICE void tile_mma(const T* A, int rows, const T* W, int K, int N, int n0, TileSmem& sm, Acc& acc) {
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
#pragma unroll
  for (int i = 0; i < kSub; ++i)
#pragma unroll
    for (int j = 0; j < kSub; ++j) acc.v[i][j] = 0.f;
  for (int k0 = 0; k0 < K; k0 += kBK) {
#pragma unroll
    for (int u = 0; u < kBM * kBK / kThreads; ++u) {
      const int idx = tid + u * kThreads, r = idx / kBK, c = idx % kBK;
      sm.a[c][r] = (r < rows && k0 + c < K) ? to_f32(load_cg_elem(A + (size_t)r * K + k0 + c)) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kBK * kBN / kThreads; ++u) {
      const int idx = tid + u * kThreads;
      const int r = kWT ? idx % kBK : idx / kBN, c = kWT ? idx / kBK : idx % kBN;
      const size_t at = kWT ? (size_t)(n0 + c) * K + k0 + r : (size_t)(k0 + r) * N + n0 + c;
      sm.w[r][c] = (k0 + r < K && n0 + c < N) ? to_f32(W[at]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float a[kSub], b[kSub];
#pragma unroll
      for (int i = 0; i < kSub; ++i) a[i] = sm.a[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < kSub; ++j) b[j] = sm.w[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < kSub; ++i)
#pragma unroll
        for (int j = 0; j < kSub; ++j) acc.v[i][j] = fmaf(a[i], b[j], acc.v[i][j]);
    }
    __syncthreads();  // the next k-step overwrites the tiles
  }
}

// Stores acc rounded to T: tile row r goes to output row row_of(r), columns
// n0 + tx + 16j. Rows >= rows and columns >= N are not written.
template <typename T, typename RowMap>
KOSMOS_DEVICE void tile_store(const Acc& acc, T* Y, int rows, int N, int n0, RowMap row_of) {
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
#pragma unroll
  for (int i = 0; i < kSub; ++i) {
    const int r = ty + 16 * i;
    if (r >= rows) continue;
    T* out = Y + (size_t)row_of(r) * N;
#pragma unroll
    for (int j = 0; j < kSub; ++j) {
      const int c = n0 + tx + 16 * j;
      if (c < N) out[c] = from_f32<T>(acc.v[i][j]);
    }
  }
}

}  // namespace kosmos::portable
