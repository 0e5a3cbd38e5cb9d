// The MoE layer's expert GEMMs on the Hopper engine (sm_90a): one persistent
// launch computes C = A @ B[e] for every expert e at once (the forward layout,
// gemm::Layout::TN in gemm/tile_problem.h's terms),
//
//   A [M, K]      rows expert-major (the receive arena's order), each expert's
//                 segment padded to a multiple of kBM rows (moe/plan.h
//                 plan_segments), so no tile row straddles two experts;
//   B [E, K, N]   the experts' weights stacked along k: [E * K, N] row-major
//                 (gate_up [E, H, 2 * I] for GEMM1 without its SwiGLU,
//                 down [E, I, H] for GEMM2);
//   C [M, N]      bf16, the rows of A's order;
//   tile_expert   [M / kBM] the expert of each tile row.
//
// Each tile's B starts at k-block tile_expert[m] * K / kBK of the stacked
// weights (gemm/tile_hooks.h b_kblock0): the engine, its tile order and its
// epilogue are the plain GEMM's. This is the megakernel's GEMM stage and the
// benchmark's floor (the expert GEMMs alone on pre-permuted rows).
//
// GEMM1 with its SwiGLU (swiglu_gemm_launch): h [M, I] = silu(gate) * up, from
// gate_up [E, H, 2I]. A 128x256 tile reads gate block n and up block I/128 + n
// of B (the split-B hook, b_halves) and SwigluStaging (moe/swiglu_sm90.cuh)
// turns the pair into h's 128x128 tile n: no [M, 2I] round trip.
#pragma once
#include <cuda_runtime.h>

#include "gemm/sm90/gemm_kernel.cuh"
#include "gemm/tile_order.h"
#include "moe/swiglu_sm90.cuh"

namespace kosmos::moe {

struct GroupedHooks {
  static constexpr bool kTileDone = false, kMapsRows = false, kGroupedB = true;
  const int* tile_expert;  // [M / kBM], read once per tile by the loading thread
  int kblocks;             // K / kBK: one expert's k-blocks
  KOSMOS_DEVICE void before_tile(gemm::TileCoord) {}
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(gemm::TileCoord) {}
  KOSMOS_DEVICE int b_kblock0(gemm::TileCoord t) const { return __ldg(tile_expert + t.m) * kblocks; }
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) grouped_gemm_sm90(const __grid_constant__ sm90::Params<Cfg> p,
                                                                      const int* tile_expert, int group) {
  extern __shared__ char smem_raw[];
  auto& s = sm90::shared_storage<Cfg>(smem_raw);
  GroupedHooks hooks{tile_expert, p.K / Cfg::kBK};
  const gemm::SwizzledOrder order{gemm::ceil_div(p.M, Cfg::kBM), gemm::ceil_div(p.N, Cfg::kBN), group};
  gemm::StaticScheduler sched(order, blockIdx.x, gridDim.x);
  sm90::TileEngine<Cfg, gemm::bf16, GroupedHooks>::run(p, s, sched, hooks);
}

// The problem's shape, or an empty string when the grouped GEMM can run it.
template <class Cfg>
const char* grouped_unsupported(int M, int N, int K, int experts) {
  static_assert(Cfg::kLayout == gemm::Layout::TN, "x @ W: the experts' weights are [K, N] row-major (B MN-major)");
  if (M < 0 || M % Cfg::kBM) return "M (the padded rows) must be a multiple of the tile rows (128)";
  if (K <= 0 || K % Cfg::kBK) return "K must be a positive multiple of 64: each expert's weights start on a k-block";
  if (N <= 0 || N % 8) return "N must be a positive multiple of 8 (TMA rows of 16 bytes, the staged epilogue)";
  if (experts < 1) return "at least one expert";
  return "";
}

// The persistent grid of a grouped launch over rows x cols tiles: *grid (<= 0:
// one CTA per SM) capped at the resident CTAs and the tile count; returns the
// swizzle group of its tile order.
template <class Cfg>
int grouped_grid(int rows, int cols, int resident, int* grid) {
  const int tiles = rows * cols;
  if (*grid <= 0 || *grid > resident) *grid = resident;
  *grid = *grid < tiles ? *grid : tiles;
  return gemm::swizzle_group(rows, *grid, Cfg::kBM, Cfg::kBN);
}

// Launches the grouped GEMM on `stream` with `grid` CTAs (<= 0: one per SM;
// capped at the tile count). a [M, K], b [E, K, N], c [M, N] bf16;
// tile_expert: device array [M / 128]. cudaErrorInvalidValue when
// grouped_unsupported says why.
template <class Cfg>
cudaError_t grouped_gemm_launch(const void* a, const void* b, void* c, const int* tile_expert, int M, int N, int K,
                                int experts, int grid, cudaStream_t stream) {
  if (*grouped_unsupported<Cfg>(M, N, K, experts)) return cudaErrorInvalidValue;
  if (M == 0) return cudaSuccess;  // no expert has a row (TMA cannot describe an empty matrix)
  int resident = 0;
  if (cudaError_t err = sm90::prepare_persistent<Cfg, grouped_gemm_sm90<Cfg>>(&resident); err != cudaSuccess)
    return err;
  // B's descriptor spans every expert: [E * K, N] (engine terms: N rows of E * K, MN-major).
  const auto* pa = static_cast<const sm90::bf16*>(a);
  const auto* pb = static_cast<const sm90::bf16*>(b);
  sm90::Params<Cfg> p{sm90::make_operand_tma<Cfg::kMajorA, typename Cfg::RingA>(pa, M, K, K),
                      sm90::make_operand_tma<Cfg::kMajorB, typename Cfg::RingB>(pb, N, experts * K, N),
                      sm90::make_output_tma<Cfg>(c, M, N, N), c, M, N, K};
  const int rows = M / Cfg::kBM, group = grouped_grid<Cfg>(rows, gemm::ceil_div(N, Cfg::kBN), resident, &grid);
  const size_t smem = sm90::SharedStorage<Cfg>::kLaunchBytes;
  grouped_gemm_sm90<Cfg><<<grid, Cfg::kThreads, smem, stream>>>(p, tile_expert, group);
  return cudaGetLastError();
}

// GEMM1's hooks: tile (m, n) reads gate half-block n and up half-block
// up_block + n of its expert's weights and leaves as h's tile (m, n).
template <class Cfg>
struct SwigluHooks {
  static constexpr bool kTileDone = false, kMapsRows = true, kStoreBoxes = true, kGroupedB = true, kSplitB = true;
  using P = sm90::Params<Cfg>;
  const int* tile_expert;               // [M / kBM]
  int kblocks;                          // H / kBK: one expert's k-blocks
  int up_block;                         // I / (kBN / 2): the up columns' first half-block
  const typename P::TmaBHalf* b_half;   // over gate_up [E * H, 2I], kernel parameters
  const typename P::TmaC* h_map;        // over h [M, I], kernel parameters
  int rows, cols;                       // M, I
  KOSMOS_DEVICE void before_tile(gemm::TileCoord) {}
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(gemm::TileCoord) {}
  KOSMOS_DEVICE int b_kblock0(gemm::TileCoord t) const { return __ldg(tile_expert + t.m) * kblocks; }
  KOSMOS_DEVICE const typename P::TmaBHalf* b_halves(gemm::TileCoord t, int* n_lo, int* n_hi) const {
    *n_lo = t.n, *n_hi = up_block + t.n;
    return b_half;
  }
  KOSMOS_DEVICE sm90::StoreBox<typename P::TmaC> store_box(gemm::TileCoord t) const {
    return {h_map, rows, cols, t.m, t.n * (Cfg::kBN / 2)};
  }
  // The engine's register path (N % 8 != 0) never runs: N = 2I is a multiple of 256.
  template <class OutT>
  KOSMOS_DEVICE OutT* row_ptr(gemm::TileCoord, int) const {
    return nullptr;
  }
};

// p: A [M, H], B gate_up as [2I rows, E * H] (engine terms), p.tma_c over h
// [M, I]; p.N = 2I, p.K = H.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    swiglu_gemm_sm90(const __grid_constant__ sm90::Params<Cfg> p,
                     const __grid_constant__ typename sm90::Params<Cfg>::TmaBHalf b_half, const int* tile_expert,
                     int group) {
  extern __shared__ char smem_raw[];
  auto& s = sm90::shared_storage<Cfg>(smem_raw);
  const int half_blocks = p.N / Cfg::kBN;  // I / (kBN / 2): h's tile columns
  SwigluHooks<Cfg> hooks{tile_expert, p.K / Cfg::kBK, half_blocks, &b_half, &p.tma_c, p.M, p.N / 2};
  const gemm::SwizzledOrder order{p.M / Cfg::kBM, half_blocks, group};
  gemm::StaticScheduler sched(order, blockIdx.x, gridDim.x);
  sm90::TileEngine<Cfg, gemm::bf16, SwigluHooks<Cfg>, SwigluStaging>::run(p, s, sched, hooks);
}

// The problem's shape, or an empty string when GEMM1 with SwiGLU can run it.
template <class Cfg>
const char* swiglu_unsupported(int M, int I, int H, int experts) {
  static_assert(Cfg::kBN == 256, "a tile pairs a 128-column gate block with its up block");
  if (I <= 0 || I % (Cfg::kBN / 2))
    return "I (the experts' intermediate size) must be a positive multiple of 128: each tile pairs a 128-column "
           "gate block with its up block";
  return grouped_unsupported<Cfg>(M, 2 * I, H, experts);
}

// Launches GEMM1 with its SwiGLU on `stream` with `grid` CTAs (<= 0: one per
// SM; capped at the tile count): h [M, I] = silu(a @ b[e][:, :I]) * (a @ b[e][:, I:])
// per tile row's expert e. a [M, H], b gate_up [E, H, 2I], h bf16;
// tile_expert: device array [M / 128]. cudaErrorInvalidValue when
// swiglu_unsupported says why.
template <class Cfg>
cudaError_t swiglu_gemm_launch(const void* a, const void* b, void* h, const int* tile_expert, int M, int I, int H,
                               int experts, int grid, cudaStream_t stream) {
  if (*swiglu_unsupported<Cfg>(M, I, H, experts)) return cudaErrorInvalidValue;
  if (M == 0) return cudaSuccess;  // no expert has a row (TMA cannot describe an empty matrix)
  int resident = 0;
  if (cudaError_t err = sm90::prepare_persistent<Cfg, swiglu_gemm_sm90<Cfg>>(&resident); err != cudaSuccess)
    return err;
  const auto* pa = static_cast<const sm90::bf16*>(a);
  const auto* pb = static_cast<const sm90::bf16*>(b);
  const int N = 2 * I;
  sm90::Params<Cfg> p{sm90::make_operand_tma<Cfg::kMajorA, typename Cfg::RingA>(pa, M, H, H),
                      sm90::make_operand_tma<Cfg::kMajorB, typename Cfg::RingB>(pb, N, experts * H, N),
                      sm90::make_output_tma<Cfg>(h, M, I, I), h, M, N, H};
  const auto b_half = sm90::make_operand_tma<Cfg::kMajorB, typename Cfg::RingBHalf>(pb, N, experts * H, N);
  // A tile reads kBN columns of B (gate and up halves): the swizzle's column width.
  const int rows = M / Cfg::kBM, group = grouped_grid<Cfg>(rows, N / Cfg::kBN, resident, &grid);
  const size_t smem = sm90::SharedStorage<Cfg>::kLaunchBytes;
  swiglu_gemm_sm90<Cfg><<<grid, Cfg::kThreads, smem, stream>>>(p, b_half, tile_expert, group);
  return cudaGetLastError();
}

}  // namespace kosmos::moe
