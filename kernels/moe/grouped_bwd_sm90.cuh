// The MoE layer's backward expert GEMMs on the Hopper engine (sm_90a), each
// one persistent launch over every expert at once: the backward's floor (the
// GEMMs alone on pre-permuted rows) and the tile stages of its megakernel.
// Rows are expert-major in segments padded to kBM rows, as the forward's
// (moe/grouped_gemm_sm90.cuh); padding rows must be zeros (or finite with the
// other operand's zero), so they add nothing to a weight gradient.
//
//  dgrad   C [M, N] = A [M, K] @ B[e]^T, B [E, N, K] row-major (gemm::Layout::NN:
//          both operands K-major), e = tile_expert[tile row]: dgrad1 (dX_rows =
//          dh1 @ W1[e]^T, N = H, K = 2I). Tile (m, n) reads B's rows from
//          e * N (the b_row0 hook).
//  dgrad2  the same with the SwiGLU backward in its epilogue (moe/swiglu_bwd_sm90.cuh):
//          dh1 [M, 2I] from da = dY_rows @ W2[e]^T (N = I, K = H) and the
//          forward's pre-activations h1 [M, 2I].
//  wgrad   C [E, P, Q] with C[e] = A[rows of e]^T @ B[rows of e], A [R, P],
//          B [R, Q] (gemm::Layout::NT: both MN-major): wgrad2 (dW2 = act^T @
//          dY_rows) and wgrad1 (dW1 = X_rows^T @ dh1). Tile row m is row block
//          m % (P / kBM) of expert m / (P / kBM); it contracts that expert's row
//          blocks [expert_rb[e], expert_rb[e + 1]) (the k_range hook: no rows,
//          zeros), in ascending row order, so dW is bitwise reproducible.
#pragma once
#include <cuda_runtime.h>

#include "gemm/sm90/gemm_kernel.cuh"
#include "gemm/tile_order.h"
#include "moe/grouped_gemm_sm90.cuh"
#include "moe/swiglu_bwd_sm90.cuh"

namespace kosmos::moe {

// dgrad's hooks: tile (m, n) reads B rows [tile_expert[m] * N + n * kBN, + kBN).
template <class Cfg>
struct DgradHooks {
  static constexpr bool kTileDone = false, kMapsRows = false, kRowsB = true;
  const int* tile_expert;  // [M / kBM]
  int N;                   // one expert's rows of B
  KOSMOS_DEVICE void before_tile(gemm::TileCoord) {}
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(gemm::TileCoord) {}
  KOSMOS_DEVICE int b_row0(gemm::TileCoord t) const { return __ldg(tile_expert + t.m) * N; }
};

// dgrad2's hooks: DgradHooks' B over W2 [E, I, H], and where dh1's two tiles go.
template <class Cfg>
struct SwigluBwdHooks : DgradHooks<Cfg> {
  static constexpr bool kMapsRows = true, kStoreBoxes = true;
  using TmaC = typename sm90::Params<Cfg>::TmaC;
  const TmaC* dgate;   // over dh1's gate columns: [M, I] with row pitch 2I (kernel parameters)
  const TmaC* dup;     // over its up columns, from column I
  const gemm::bf16* h1;  // [M, 2I]
  int M;
  KOSMOS_DEVICE sm90::StoreBox<TmaC> store_box(gemm::TileCoord t) const {
    return {dup, M, this->N, t.m, t.n * Cfg::kBN};
  }
  KOSMOS_DEVICE sm90::StoreBox<TmaC> gate_box(gemm::TileCoord t) const {
    return {dgate, M, this->N, t.m, t.n * Cfg::kBN};
  }
  KOSMOS_DEVICE const gemm::bf16* preact_row(gemm::TileCoord t, int r) const {
    const int row = t.m * Cfg::kBM + r;
    return row < M ? h1 + (size_t)row * 2 * this->N : nullptr;
  }
  KOSMOS_DEVICE int preact_cols() const { return this->N; }
  // Unreachable: every tile leaves through its two store boxes.
  template <class OutT>
  KOSMOS_DEVICE OutT* row_ptr(gemm::TileCoord, int) const {
    return nullptr;
  }
};

// wgrad's hooks: tile row m is expert m / per's row block m % per of A's P columns.
template <class Cfg>
struct WgradHooks {
  static constexpr bool kTileDone = false, kMapsRows = false, kSplitA = true, kKRange = true;
  using TmaA = typename sm90::Params<Cfg>::TmaA;
  const int* expert_rb;  // [E + 1] the experts' row-block bounds (kBM rows each)
  const TmaA* a;         // the Problem's A: [R, P] as (P, R), MN-major
  int per, P;            // P / kBM, P
  KOSMOS_DEVICE void before_tile(gemm::TileCoord) {}
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(gemm::TileCoord) {}
  KOSMOS_DEVICE const TmaA* a_source(gemm::TileCoord t, int* rows, int* tile_m) const {
    *rows = P;
    *tile_m = t.m % per;
    return a;
  }
  KOSMOS_DEVICE void k_range(gemm::TileCoord t, int* a_kb0, int* b_kb0, int* kblocks) const {
    constexpr int kPer = Cfg::kBM / Cfg::kBK;  // k-blocks per row block
    const int e = t.m / per, lo = __ldg(expert_rb + e), hi = __ldg(expert_rb + e + 1);
    *a_kb0 = *b_kb0 = lo * kPer;
    *kblocks = (hi - lo) * kPer;
  }
};

template <class Cfg, class Hooks, template <class, class, bool, class> class Staging = sm90::PlainStaging>
CUTE_DEVICE void grouped_run(const sm90::Params<Cfg>& p, Hooks& hooks, int rows, int cols, int group) {
  extern __shared__ char smem_raw[];
  auto& s = sm90::shared_storage<Cfg>(smem_raw);
  const gemm::SwizzledOrder order{rows, cols, group};
  gemm::StaticScheduler sched(order, blockIdx.x, gridDim.x);
  sm90::TileEngine<Cfg, gemm::bf16, Hooks, Staging>::run(p, s, sched, hooks);
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    grouped_dgrad_sm90(const __grid_constant__ sm90::Params<Cfg> p, const int* tile_expert, int N, int group) {
  DgradHooks<Cfg> hooks{tile_expert, N};
  grouped_run<Cfg>(p, hooks, p.M / Cfg::kBM, gemm::ceil_div(N, Cfg::kBN), group);
}

// p's B spans W2 [E * I, H]; dgate / dup over dh1 [M, 2I] (kernel parameters).
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    swiglu_bwd_sm90(const __grid_constant__ sm90::Params<Cfg> p,
                    const __grid_constant__ typename sm90::Params<Cfg>::TmaC dgate,
                    const __grid_constant__ typename sm90::Params<Cfg>::TmaC dup, const int* tile_expert,
                    const gemm::bf16* h1, int group) {
  SwigluBwdHooks<Cfg> hooks{{tile_expert, p.N}, &dgate, &dup, h1, p.M};
  grouped_run<Cfg, SwigluBwdHooks<Cfg>, SwigluBwdStaging>(p, hooks, p.M / Cfg::kBM, gemm::ceil_div(p.N, Cfg::kBN),
                                                          group);
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    grouped_wgrad_sm90(const __grid_constant__ sm90::Params<Cfg> p, const int* expert_rb, int P, int group) {
  WgradHooks<Cfg> hooks{expert_rb, &p.tma_a, P / Cfg::kBM, P};
  grouped_run<Cfg>(p, hooks, p.M / Cfg::kBM, gemm::ceil_div(p.N, Cfg::kBN), group);
}

// The problems' shapes, or "" when the kernels run them (values named by the caller).
template <class Cfg>
const char* dgrad_unsupported(int M, int N, int K, int experts) {
  static_assert(Cfg::kLayout == gemm::Layout::NN, "dY @ W^T: A and B K-major");
  if (M < 0 || M % Cfg::kBM) return "M (the padded rows) must be a multiple of the tile rows (128)";
  if (K <= 0 || K % 8) return "K must be a positive multiple of 8 (TMA rows of 16 bytes)";
  if (N <= 0 || N % 8) return "N must be a positive multiple of 8 (TMA rows of 16 bytes, the staged epilogue)";
  if (experts < 1) return "at least one expert";
  return "";
}
template <class Cfg>
const char* wgrad_unsupported(int R, int P, int Q, int experts) {
  static_assert(Cfg::kLayout == gemm::Layout::NT, "X^T @ dY: A and B MN-major");
  if (R < 0 || R % Cfg::kBM) return "R (the padded rows) must be a multiple of the tile rows (128)";
  if (P <= 0 || P % Cfg::kBM) return "P (dW's rows per expert) must be a positive multiple of 128: a tile is one expert's";
  if (Q <= 0 || Q % 8) return "Q must be a positive multiple of 8 (TMA rows of 16 bytes)";
  if (experts < 1) return "at least one expert";
  return "";
}

// Launchers on `stream` with `grid` CTAs (<= 0: one per SM; capped at the tile
// count); cudaErrorInvalidValue where *_unsupported says why.
//   dgrad:  c [M, N] = a [M, K] @ b[e]^T, b [E, N, K], tile_expert [M / 128] on the device.
template <class Cfg>
cudaError_t grouped_dgrad_launch(const void* a, const void* b, void* c, const int* tile_expert, int M, int N, int K,
                                 int experts, int grid, cudaStream_t stream) {
  if (*dgrad_unsupported<Cfg>(M, N, K, experts)) return cudaErrorInvalidValue;
  if (M == 0) return cudaSuccess;
  int resident = 0;
  if (cudaError_t err = sm90::prepare_persistent<Cfg, grouped_dgrad_sm90<Cfg>>(&resident); err != cudaSuccess)
    return err;
  const auto* pa = static_cast<const sm90::bf16*>(a);
  const auto* pb = static_cast<const sm90::bf16*>(b);
  sm90::Params<Cfg> p{sm90::make_operand_tma<Cfg::kMajorA, typename Cfg::RingA>(pa, M, K, K),
                      sm90::make_operand_tma<Cfg::kMajorB, typename Cfg::RingB>(pb, experts * N, K, K),
                      sm90::make_output_tma<Cfg>(c, M, N, N), c, M, N, K};
  const int rows = M / Cfg::kBM, group = grouped_grid<Cfg>(rows, gemm::ceil_div(N, Cfg::kBN), resident, &grid);
  grouped_dgrad_sm90<Cfg><<<grid, Cfg::kThreads, sm90::SharedStorage<Cfg>::kLaunchBytes, stream>>>(p, tile_expert, N,
                                                                                                 group);
  return cudaGetLastError();
}

//   dgrad2: dh1 [M, 2I] from dy [M, H], w2 [E, I, H], h1 [M, 2I].
template <class Cfg>
cudaError_t swiglu_bwd_launch(const void* dy, const void* w2, const void* h1, void* dh1, const int* tile_expert, int M,
                              int I, int H, int experts, int grid, cudaStream_t stream) {
  if (*dgrad_unsupported<Cfg>(M, I, H, experts)) return cudaErrorInvalidValue;
  if (M == 0) return cudaSuccess;
  int resident = 0;
  if (cudaError_t err = sm90::prepare_persistent<Cfg, swiglu_bwd_sm90<Cfg>>(&resident); err != cudaSuccess) return err;
  const auto* pa = static_cast<const sm90::bf16*>(dy);
  const auto* pb = static_cast<const sm90::bf16*>(w2);
  auto* out = static_cast<sm90::bf16*>(dh1);
  sm90::Params<Cfg> p{sm90::make_operand_tma<Cfg::kMajorA, typename Cfg::RingA>(pa, M, H, H),
                      sm90::make_operand_tma<Cfg::kMajorB, typename Cfg::RingB>(pb, experts * I, H, H),
                      {}, nullptr, M, I, H};
  const auto dgate = sm90::make_output_tma<Cfg>(out, M, I, 2 * I), dup = sm90::make_output_tma<Cfg>(out + I, M, I, 2 * I);
  const int rows = M / Cfg::kBM, group = grouped_grid<Cfg>(rows, gemm::ceil_div(I, Cfg::kBN), resident, &grid);
  swiglu_bwd_sm90<Cfg><<<grid, Cfg::kThreads, sm90::SharedStorage<Cfg>::kLaunchBytes, stream>>>(
      p, dgate, dup, tile_expert, static_cast<const gemm::bf16*>(h1), group);
  return cudaGetLastError();
}

//   wgrad:  c [E, P, Q], c[e] = a[rows of e]^T @ b[rows of e]; a [R, P], b [R, Q],
//           expert_rb [E + 1] row-block bounds on the device.
template <class Cfg>
cudaError_t grouped_wgrad_launch(const void* a, const void* b, void* c, const int* expert_rb, int R, int P, int Q,
                                 int experts, int grid, cudaStream_t stream) {
  if (*wgrad_unsupported<Cfg>(R, P, Q, experts)) return cudaErrorInvalidValue;
  int resident = 0;
  if (cudaError_t err = sm90::prepare_persistent<Cfg, grouped_wgrad_sm90<Cfg>>(&resident); err != cudaSuccess)
    return err;
  const auto* pa = static_cast<const sm90::bf16*>(a);
  const auto* pb = static_cast<const sm90::bf16*>(b);
  // With no rows at all TMA cannot describe the operands; every expert's dW is zeros.
  if (R == 0) return cudaMemsetAsync(c, 0, (size_t)experts * P * Q * sizeof(sm90::bf16), stream);
  sm90::Params<Cfg> p{sm90::make_operand_tma<Cfg::kMajorA, typename Cfg::RingA>(pa, P, R, P),
                      sm90::make_operand_tma<Cfg::kMajorB, typename Cfg::RingB>(pb, Q, R, Q),
                      sm90::make_output_tma<Cfg>(c, experts * P, Q, Q), c, experts * P, Q, R};
  const int rows = experts * P / Cfg::kBM, group = grouped_grid<Cfg>(rows, gemm::ceil_div(Q, Cfg::kBN), resident, &grid);
  grouped_wgrad_sm90<Cfg><<<grid, Cfg::kThreads, sm90::SharedStorage<Cfg>::kLaunchBytes, stream>>>(p, expert_rb, P,
                                                                                                 group);
  return cudaGetLastError();
}

}  // namespace kosmos::moe
