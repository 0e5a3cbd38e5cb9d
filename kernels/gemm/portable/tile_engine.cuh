// Portable tile engine: the same interface as the Hopper engine
// (gemm/sm90/tile_engine.cuh) on plain SIMT fp32 FMAs, so it runs on any CUDA
// or HIP GPU. It is the correctness oracle for the fast engines and the
// fallback for problems TMA cannot describe (unaligned leading dimensions).
//
// Every thread of a CTA of kThreads calls run(problem, smem, scheduler,
// hooks); thread 0 claims each tile and broadcasts it through shared memory.
// All three layouts, any sizes: loads past the edges read zeros, stores past
// them are skipped. Operands are InT (bf16 by default; f16 and fp32 too), all
// arithmetic is fp32 FMA.
#pragma once
#include "gemm/elem.h"
#include "gemm/tile_hooks.h"
#include "gemm/tile_order.h"
#include "gemm/tile_problem.h"

namespace kosmos::portable {

template <gemm::Layout L, class OutT, class InT = gemm::bf16>
struct TileEngine {
  static constexpr int kBM = 128, kBN = 128, kBK = 16;
  static constexpr int kThreads = 256;
  static constexpr int kSub = 8;  // each thread owns a kSub x kSub strided sub-block
  static constexpr gemm::Major kMajorA = gemm::major_a(L), kMajorB = gemm::major_b(L);

  struct Smem {
    float a[kBK][kBM];  // k-major, so a thread's kSub rows at one k are one broadcast row
    float b[kBK][kBN];
    gemm::TileCoord claim;
    int claim_valid;
  };
  struct Acc {
    float v[kSub][kSub];
  };

  // Operand element (row, k) of a rows x K operand of the given major, or 0 past the edge.
  template <gemm::Major Mj>
  static KOSMOS_DEVICE float load(const InT* p, int rows, int K, int r, int k) {
    if (r >= rows || k >= K) return 0.f;
    return gemm::load_f32(Mj == gemm::Major::K ? p + (size_t)r * K + k : p + (size_t)k * rows + r);
  }

  // Stages one (kTile x kBK) operand block in smem; thread order follows the
  // contiguous index so global loads coalesce in either major.
  template <gemm::Major Mj, int kTile>
  static KOSMOS_DEVICE void stage(const InT* p, int rows, int K, int r0, int k0, float (*dst)[kTile]) {
    for (int idx = threadIdx.x; idx < kTile * kBK; idx += kThreads) {
      const int r = Mj == gemm::Major::K ? idx / kBK : idx % kTile;
      const int k = Mj == gemm::Major::K ? idx % kBK : idx / kTile;
      dst[k][r] = load<Mj>(p, rows, K, r0 + r, k0 + k);
    }
  }

  static KOSMOS_DEVICE void mma_kblock(const Smem& s, Acc& acc) {
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float a[kSub], b[kSub];
#pragma unroll
      for (int i = 0; i < kSub; ++i) a[i] = s.a[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < kSub; ++j) b[j] = s.b[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < kSub; ++i)
#pragma unroll
        for (int j = 0; j < kSub; ++j) acc.v[i][j] = fmaf(a[i], b[j], acc.v[i][j]);
    }
  }

  static KOSMOS_DEVICE void store(const gemm::Problem& p, const Acc& acc, gemm::TileCoord t) {
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    OutT* C = static_cast<OutT*>(p.c);
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      const int r = t.m * kBM + ty + 16 * i;
      if (r >= p.M) continue;
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
        const int c = t.n * kBN + tx + 16 * j;
        if (c < p.N) gemm::store_f32(C + (size_t)r * p.N + c, acc.v[i][j]);
      }
    }
  }

  // CTA-wide: compute and store output tile t. Thread 0 has already run
  // hooks.before_tile(t); before_k runs on thread 0 ahead of each k-block.
  template <class Hooks>
  static KOSMOS_DEVICE void tile(const gemm::Problem& p, gemm::TileCoord t, Smem& s, Hooks& h) {
    const auto* A = static_cast<const InT*>(p.a);
    const auto* B = static_cast<const InT*>(p.b);
    Acc acc;
#pragma unroll
    for (int i = 0; i < kSub; ++i)
#pragma unroll
      for (int j = 0; j < kSub; ++j) acc.v[i][j] = 0.f;
    for (int k0 = 0; k0 < p.K; k0 += kBK) {
      if (threadIdx.x == 0) h.before_k(t, k0);
      __syncthreads();  // before_k's acquire, and the previous k-block's reads, precede the overwrite
      stage<kMajorA, kBM>(A, p.M, p.K, t.m * kBM, k0, s.a);
      stage<kMajorB, kBN>(B, p.N, p.K, t.n * kBN, k0, s.b);
      __syncthreads();
      mma_kblock(s, acc);
    }
    store(p, acc, t);
    if constexpr (Hooks::kTileDone) {
      __syncthreads();  // every store of the tile issued before the release
      if (threadIdx.x == 0) h.tile_done(t);
    }
  }

  template <class Sched, class Hooks>
  static KOSMOS_DEVICE void run(const gemm::Problem& p, Smem& s, Sched& sched, Hooks& h) {
    for (;;) {
      if (threadIdx.x == 0) {
        gemm::TileCoord t{0, 0};
        s.claim_valid = sched.next(t);
        s.claim = t;
        if (s.claim_valid) h.before_tile(t);
      }
      __syncthreads();
      const gemm::TileCoord t = s.claim;
      const bool ok = s.claim_valid != 0;
      __syncthreads();  // everyone has read the claim before thread 0 writes the next
      if (!ok) return;
      tile(p, t, s, h);
    }
  }
};

// Whole-GEMM kernel over the portable engine with a plain row-major tile order.
template <gemm::Layout L, class OutT, class InT = gemm::bf16>
__global__ void __launch_bounds__(256) portable_gemm(gemm::Problem p) {
  using E = TileEngine<L, OutT, InT>;
  __shared__ typename E::Smem s;
  const gemm::SwizzledOrder order{gemm::ceil_div(p.M, E::kBM), gemm::ceil_div(p.N, E::kBN), 1};
  gemm::StaticScheduler sched(order, blockIdx.x, gridDim.x);
  gemm::NoHooks hooks;
  E::run(p, s, sched, hooks);
}

}  // namespace kosmos::portable
