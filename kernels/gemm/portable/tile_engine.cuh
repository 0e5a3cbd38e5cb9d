// Portable tile engine: the same interface and hook contract as the Hopper
// engine (gemm/sm90/tile_engine.cuh, gemm/tile_hooks.h) on plain SIMT fp32
// FMAs, so it runs on any CUDA or HIP GPU. It is ops.matmul's engine where TMA
// cannot run, the correctness oracle for the fast engines, and the builders of
// every fused TP+SP kernel's portable variant (tp/*.cuh), which plug in through
// the hooks exactly as their Hopper variants do.
//
// Every thread of a CTA of kThreads calls run(problem, smem, scheduler,
// hooks); thread 0 claims each tile, runs before_tile, and broadcasts the claim
// through shared memory. All three layouts, any sizes: loads past the edges
// read zeros, stores past them are skipped. Operands are InT (bf16 by default;
// f16 and fp32 too), all arithmetic is fp32 FMA in ascending k, whatever the
// hooks, so a fused kernel's tiles have the bits of the plain GEMM's.
// Hooks it honours: before_tile, before_k, tile_done (kTileDone), row_ptr
// (kMapsRows), a_source (kSplitA), b_halves (kSplitB) and kMovedB; the Hopper engine's
// store-box, trace and grouped-B hooks have no meaning here and are refused at
// compile time. An op whose epilogue does more than store the tile (the MoE
// GEMM1's SwiGLU, moe/fwd_portable.cuh) runs mainloop() and stores the
// accumulators itself, by acc_row / acc_col, as Hopper ops bring a staging type.
#pragma once
#include <cstddef>

#include "gemm/elem.h"
#include "gemm/tile_hooks.h"
#include "gemm/tile_order.h"
#include "gemm/tile_problem.h"
#include "kosmos/types.h"

namespace kosmos::portable {

// The engine's tile. kBM is also the tile-row height the fused kernels' movers
// copy and GEMM+RS stages and reduces by (tp/ag_gemm.cuh, tp/gemm_rs.cuh), on
// either engine: the Hopper kernels assert their kBM equals it.
constexpr int kBM = 128, kBN = 128, kBK = 16;
constexpr int kThreads = 256;

// Not a member of TileEngine: the fused kernels' shared state embeds it beside
// their own fields, whatever layout and types their engine runs.
struct EngineSmem {
  float a[kBK][kBM];  // k-major, so a thread's kSub rows at one k are one broadcast row
  float b[kBK][kBN];
  gemm::TileCoord claim;
  int claim_valid;
};

template <gemm::Layout L, class OutT, class InT = gemm::bf16>
struct TileEngine {
  static constexpr int kBM = portable::kBM, kBN = portable::kBN, kBK = portable::kBK;
  static constexpr int kThreads = portable::kThreads;
  static constexpr int kSub = 8;  // each thread owns a kSub x kSub strided sub-block
  static_assert(kThreads == 256 && kBM == 16 * kSub && kBN == 16 * kSub, "16 x 16 threads, kSub x kSub each");
  static constexpr gemm::Major kMajorA = gemm::major_a(L), kMajorB = gemm::major_b(L);
  using Smem = EngineSmem;
  // A thread's accumulators: v[i][j] is the tile's row acc_row(i), column
  // acc_col(j), so column j + kSub / 2 is column j's plus kBN / 2.
  struct Acc {
    float v[kSub][kSub];
  };
  static KOSMOS_DEVICE int acc_row(int i) { return (int)(threadIdx.x / 16) + 16 * i; }
  static KOSMOS_DEVICE int acc_col(int j) { return (int)(threadIdx.x % 16) + 16 * j; }

  // Tile t's A operand: `rows` rows, t's rows starting at tile row m of it.
  struct ASrc {
    const InT* a;
    int rows, m;
  };

  // Operand element (row, k) of a rows x K operand of the given major, or 0 past
  // the edge. kCg: an L2-only load, for rows written during the launch.
  template <gemm::Major Mj, bool kCg>
  static KOSMOS_DEVICE float load(const InT* p, int rows, int K, int r, int k) {
    if (r >= rows || k >= K) return 0.f;
    const InT* at = Mj == gemm::Major::K ? p + (size_t)r * K + k : p + (size_t)k * rows + r;
    if constexpr (kCg) {
      const InT v = load_cg_elem(at);
      return gemm::load_f32(&v);
    } else {
      return gemm::load_f32(at);
    }
  }

  // Stages one (kTile x kBK) operand block in smem, tile row r from operand row
  // row_of(r); thread order follows the contiguous index so global loads
  // coalesce in either major.
  template <gemm::Major Mj, int kTile, bool kCg, class RowOf>
  static KOSMOS_DEVICE void stage(const InT* p, int rows, int K, RowOf row_of, int k0, float (*dst)[kTile]) {
    for (int idx = threadIdx.x; idx < kTile * kBK; idx += kThreads) {
      const int r = Mj == gemm::Major::K ? idx / kBK : idx % kTile;
      const int k = Mj == gemm::Major::K ? idx % kBK : idx / kTile;
      dst[k][r] = load<Mj, kCg>(p, rows, K, row_of(r), k0 + k);
    }
  }

  // Tile t's B: the Problem's B, its rows t.n * kBN on; or (kSplitB) the B the
  // hooks name, its half-block lo (kBN / 2 rows) in the tile's first half and
  // half-block hi in the second (a pure function of t, so every thread asks).
  template <class Hooks>
  static KOSMOS_DEVICE void stage_b(const gemm::Problem& p, gemm::TileCoord t, int k0, Smem& s, const Hooks& h) {
    if constexpr (gemm::splits_b_v<Hooks>) {
      int lo = 0, hi = 0;
      const InT* b = h.b_halves(t, &lo, &hi);
      const int first = lo * (kBN / 2), second = hi * (kBN / 2) - kBN / 2;
      stage<kMajorB, kBN, false>(b, p.N, p.K, [=](int r) { return (r < kBN / 2 ? first : second) + r; }, k0, s.b);
    } else {
      // kMovedB: B's rows were written during the launch (the MoE backward's
      // weight gradients read the gathered dY rows and dgrad2's d(gate | up)),
      // so L2-only, as a_source's A.
      stage<kMajorB, kBN, gemm::moved_b_v<Hooks>>(static_cast<const InT*>(p.b), p.N, p.K,
                                                 [&](int r) { return t.n * kBN + r; }, k0, s.b);
    }
  }

  static KOSMOS_DEVICE void mma_kblock(const Smem& s, Acc& acc) {
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float a[kSub], b[kSub];
#pragma unroll
      for (int i = 0; i < kSub; ++i) a[i] = s.a[kk][acc_row(i)];
#pragma unroll
      for (int j = 0; j < kSub; ++j) b[j] = s.b[kk][acc_col(j)];
#pragma unroll
      for (int i = 0; i < kSub; ++i)
#pragma unroll
        for (int j = 0; j < kSub; ++j) acc.v[i][j] = fmaf(a[i], b[j], acc.v[i][j]);
    }
  }

  // The Problem's A, or the matrix the hooks name for tile t (kSplitA: a pure
  // function of t, so every thread asks rather than one broadcasting it).
  template <class Hooks>
  static KOSMOS_DEVICE ASrc a_of(const gemm::Problem& p, gemm::TileCoord t, const Hooks& h) {
    if constexpr (gemm::split_a_v<Hooks>) {
      int rows = 0, m = 0;
      if (const InT* a = h.a_source(t, &rows, &m)) return {a, rows, m};
    }
    return {static_cast<const InT*>(p.a), p.M, t.m};
  }

  // Stores tile t: row r of C to the Problem's row-major [M, N], or where the
  // hooks map it (kMapsRows: element (r, c) at row_ptr(t, r)[c], nullptr skips
  // the row). Columns past N are skipped either way.
  template <class Hooks>
  static KOSMOS_DEVICE void store(const gemm::Problem& p, const Acc& acc, gemm::TileCoord t, const Hooks& h) {
    const int ty = acc_row(0), tx = acc_col(0);  // acc_row(i) = ty + 16 i, acc_col(j) = tx + 16 j
    OutT* C = static_cast<OutT*>(p.c);
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      const int r = t.m * kBM + ty + 16 * i;
      OutT* row;
      if constexpr (Hooks::kMapsRows) {
        row = h.template row_ptr<OutT>(t, r);
        if (row == nullptr) continue;
      } else {
        if (r >= p.M) continue;
        row = C + (size_t)r * p.N;
      }
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
        const int c = t.n * kBN + tx + 16 * j;
        if (c < p.N) gemm::store_f32(row + c, acc.v[i][j]);
      }
    }
  }

  // CTA-wide: tile t's accumulators (stored by the caller). Thread 0 has
  // already run hooks.before_tile(t); before_k runs on thread 0 ahead of each
  // k-block. A named by a_source is read L2-only: the fused kernels' movers and
  // peers write it during the launch (as every other read of moved rows is).
  template <class Hooks>
  static KOSMOS_DEVICE Acc mainloop(const gemm::Problem& p, gemm::TileCoord t, Smem& s, Hooks& h) {
    static_assert(!gemm::store_boxes_v<Hooks> && !gemm::traces_tiles_v<Hooks> && !gemm::groups_b_v<Hooks> &&
                      !gemm::rows_b_v<Hooks> && !gemm::ranges_k_v<Hooks>,
                  "store_box, tile_phase, b_kblock0, b_row0 and k_range are Hopper engine hooks");
    constexpr bool kCgA = gemm::split_a_v<Hooks>;
    const ASrc a = a_of(p, t, h);
    Acc acc;
#pragma unroll
    for (int i = 0; i < kSub; ++i)
#pragma unroll
      for (int j = 0; j < kSub; ++j) acc.v[i][j] = 0.f;
    for (int k0 = 0; k0 < p.K; k0 += kBK) {
      if (threadIdx.x == 0) h.before_k(t, k0);
      __syncthreads();  // before_k's acquire, and the previous k-block's reads, precede the overwrite
      stage<kMajorA, kBM, kCgA>(a.a, a.rows, p.K, [&](int r) { return a.m * kBM + r; }, k0, s.a);
      stage_b(p, t, k0, s, h);
      __syncthreads();
      mma_kblock(s, acc);
    }
    return acc;
  }

  // CTA-wide: compute and store output tile t (mainloop, then store).
  template <class Hooks>
  static KOSMOS_DEVICE void tile(const gemm::Problem& p, gemm::TileCoord t, Smem& s, Hooks& h) {
    const Acc acc = mainloop(p, t, s, h);
    store(p, acc, t, h);
    if constexpr (Hooks::kTileDone) {
      __syncthreads();  // every thread's stores of the tile precede thread 0's release in tile_done
      if (threadIdx.x == 0) h.tile_done(t);
    }
  }

  // Returns when the scheduler has no tile left, every thread together (the
  // fused kernels' CTA-wide roles follow).
  template <class Sched, class Hooks>
  static KOSMOS_DEVICE void run(const gemm::Problem& p, Smem& s, Sched& sched, Hooks& h) {
    for (;;) {
      if (threadIdx.x == 0) {
        gemm::TileCoord t{0, 0};
        s.claim_valid = sched.next(t);
        s.claim = t;
        if (s.claim_valid) h.before_tile(t);
      }
      __syncthreads();  // thread 0's before_tile acquire precedes every thread's loads of the tile
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
