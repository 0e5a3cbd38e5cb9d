// The MoE backward megakernel with portable builders: the forward's
// CTA life (moe_fwd_cta) over its device ops (moe/fwd_ops.cuh) with the
// backward's build queue (MoeBwdBuilds, moe/bwd_queues.h) run one tile at a
// time (moe_build_serial) on the portable tile engine (gemm/portable/
// tile_engine.cuh: 128 x 128 tiles, fp32 FMA in ascending k), single-source
// CUDA/HIP. The Hopper kernel (moe/bwd_sm90.cuh, which says what the ops'
// words mean in the backward) runs the same schedule, queues and workspace;
// only the tiles' widths differ (moe_portable_bwd_columns, _wgrad_tiles).
//
//   dgrad2  tile (rb, n): columns [128 n, + 128) of I; dA = dY_rows @ W2[e]^T
//           (NN: w2[e] [I][H] is B K-major), then each thread's own
//           accumulators through the SwiGLU backward (moe_swiglu_bwd, from the
//           forward's bf16 pre-activations h1, or hs for the shared expert)
//           into d(gate) and d(up), I columns apart in dh1, each rounded once.
//   dgrad1  tile (rb, n): dX_rows = dh1 @ W1[e]^T (NN: w1[e] [H][2I]).
//   wgrad2  a 128 x 128 block of dW2[x] [I, H] = act^T @ dY_rows over the
//           expert's rows (NT: both operands row-major [rows][.], offset to
//           the expert's first row, K = its rows), in the plan's row order, so
//           dW is bitwise reproducible; no rows: zeros.
//   wgrad1  a block of dW1[x] [H, 2I] = x_rows^T @ dh1 over the same rows.
// The shared expert (x = e_local): dgrad2 reads dY's token rows and hs,
// dgrad1 its own gate | up, its wgrads dY's or x's token rows (K = t: its
// arena rows past t hold zeros) against its arena rows of act and dh1.
//
// Memory model, as the portable forward's: start() acquires CTA-wide (thread
// 0 waits, then a CTA barrier) what a tile reads that the launch writes: the
// dgrads' A (the gathered dY rows, dgrad2's dh1) through a_source, L2-only;
// the wgrads' B (dY rows, dh1) through kMovedB and their A (at EP > 1 wgrad1's
// X rows arrive in the launch) through a_source, L2-only. The forward's
// workspace (x rows at EP = 1, act, h1) and the weights were written before
// the launch.
#pragma once
#include <cstddef>
#include <type_traits>

#include "gemm/portable/tile_engine.cuh"
#include "gemm/tile_hooks.h"
#include "kosmos/trace.h"
#include "moe/bwd_queues.h"
#include "moe/fwd_ops.cuh"
#include "moe/fwd_portable.cuh"
#include "moe/swiglu.h"

namespace kosmos::moe {

using MoePortableDgrad = portable::TileEngine<gemm::Layout::NN, gemm::bf16, gemm::bf16>;
using MoePortableWgrad = portable::TileEngine<gemm::Layout::NT, gemm::bf16, gemm::bf16>;

// Column blocks per row block: dgrad2's of I (nt1), dgrad1's of H (nt2).
KOSMOS_HD inline void moe_portable_bwd_columns(int H, int I, int* nt1, int* nt2) {
  *nt1 = (I + portable::kBN - 1) / portable::kBN;
  *nt2 = (H + portable::kBN - 1) / portable::kBN;
}

// The weight-gradient tiles of one expert: dW2 [I, H] and dW1 [H, 2I] in 128 x 128 blocks.
KOSMOS_HD inline MoeWgradTiles moe_portable_wgrad_tiles(int H, int I) {
  const int b = portable::kBN, cols2 = (H + b - 1) / b, cols1 = (2 * I + b - 1) / b;
  return {(I + b - 1) / b * cols2, (H + b - 1) / b * cols1, cols2, cols1};
}

template <typename T>
struct MoeBwdPortableParams {
  static_assert(std::is_same_v<T, bf16_t>, "the MoE backward runs bf16 (MoeFwdParams' rows)");
  MoeFwdParams m;    // the CTA life's words (moe/bwd_sm90.cuh); R + S rows: m.rbs
  const T* w1;       // [E][H][2I]: gate | up
  const T* w2;       // [E][I][H]
  const T* x_rows;   // [R][H]      the forward's gathered rows (its workspace)
  const T* act;      // [R + S][I]  the forward's activations
  const T* h1;       // [R][2I]     the forward's pre-activations
  T* dh1;            // [R + S][2I] d(gate | up), dgrad2's
  T* dw1;            // [E][H][2I]
  T* dw2;            // [E][I][H]
  // The shared expert's (m.s.shared_blocks > 0; else unread):
  const T* x;        // [t][H] the forward's input
  const T* hs;       // [t][2I] its pre-activations
  const T* sw1;      // [H][2I]
  const T* sw2;      // [I][H]
  T* dsw1;           // [H][2I]
  T* dsw2;           // [I][H]
  MoeWgradTiles w;   // moe_portable_wgrad_tiles
};

// A dgrad tile's hooks: start() has acquired its rows, so they wait for
// nothing; a_source names A (the dY arena, dY, or dh1) so that it is read
// L2-only.
struct MoePortableDgradHooks {
  static constexpr bool kTileDone = false, kMapsRows = false, kSplitA = true;
  const gemm::bf16* a;
  int rows;  // a's rows
  int m0;    // the tile row of a's row 0 (dY for the shared expert's dgrad2: shared_rb0)

  KOSMOS_DEVICE void before_tile(gemm::TileCoord) {}
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(gemm::TileCoord) {}
  KOSMOS_DEVICE const gemm::bf16* a_source(gemm::TileCoord t, int* a_rows, int* tile_m) const {
    *a_rows = rows;
    *tile_m = t.m - m0;
    return a;
  }
};

// A wgrad tile's hooks: its B (dY rows or dh1) was written during the launch,
// and so, at EP > 1, was wgrad1's A (the X rows peers pushed): both L2-only
// (a_source names the Problem's own A).
struct MoePortableWgradHooks {
  static constexpr bool kTileDone = false, kMapsRows = false, kMovedB = true, kSplitA = true;
  const gemm::bf16* a;
  int rows;  // a's rows (the Problem's M)
  KOSMOS_DEVICE void before_tile(gemm::TileCoord) {}
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(gemm::TileCoord) {}
  KOSMOS_DEVICE const gemm::bf16* a_source(gemm::TileCoord t, int* a_rows, int* tile_m) const {
    *a_rows = rows;
    *tile_m = t.m;
    return a;
  }
};

template <typename T>
struct MoePortableBwdOps : MoeLocalOps {
  using Dg = MoePortableDgrad;
  using Wg = MoePortableWgrad;
  const MoeBwdPortableParams<T>& pp;
  MoePortableShared& sm;

  KOSMOS_DEVICE int rows() const { return p().rbs * kMoeTileRows; }  // R + S
  KOSMOS_DEVICE bool shared(const MoeTile& t) const { return t.x == s().e_local; }
  // The engine's element type: the same bits (CUDA, HIP) under its own name.
  KOSMOS_DEVICE const gemm::bf16* elems(const bf16_t* q) const { return reinterpret_cast<const gemm::bf16*>(q); }

  // Up to `most` tiles of the backward's build queue (< 0: until it is empty), one at a time.
  KOSMOS_DEVICE int build(const MoeLayout& L, int most) {
    return moe_build_serial(MoeBwdBuilds<MoePortableBwdOps>{*this, s(), L, pp.w}, most);
  }
  // One tile, one build span (tile = its kind, as the Hopper kernel's passes).
  template <int kKind, class F>
  KOSMOS_DEVICE void traced(F&& f) {
    const TraceSpan span;
    f();
    if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceBuild, kKind);
  }
  KOSMOS_DEVICE void dgrad2(const MoeTile& t) { traced<1>([&] { swiglu_bwd_tile(t); }); }
  KOSMOS_DEVICE void dgrad1(const MoeTile& t) { traced<2>([&] { dx_tile(t); }); }
  KOSMOS_DEVICE void wgrad2(const MoeTile& t) { traced<3>([&] { wgrad_tile(t, 2); }); }
  KOSMOS_DEVICE void wgrad1(const MoeTile& t) { traced<4>([&] { wgrad_tile(t, 1); }); }

  // dh1's rows of t.rb, gate columns [128 t.n, + 128) and the up columns I
  // further on: the SwiGLU backward of dA = dY_rows @ w2[x]^T.
  KOSMOS_DEVICE void swiglu_bwd_tile(const MoeTile& t) {
    const int H = p().H, I = p().I, m0 = s().shared_rb0;
    const bool sh = shared(t);
    const gemm::bf16* w2 = sh ? elems(pp.sw2) : elems(pp.w2) + (size_t)t.x * I * H;
    MoePortableDgradHooks h{sh ? elems(p().x) : elems(p().arena), sh ? s().tokens : m0 * Dg::kBM, sh ? m0 : 0};
    const Dg::Acc acc = Dg::mainloop(gemm::Problem{p().arena, w2, pp.dh1, rows(), I, H}, {t.rb, t.n}, sm.tile, h);
#pragma unroll
    for (int i = 0; i < Dg::kSub; ++i) {
      const int row = t.rb * Dg::kBM + Dg::acc_row(i), tok = row - m0 * Dg::kBM;
      // The shared expert's rows past t read no pre-activations: their dY rows are zeros, and so are they.
      const bf16_t* pre = !sh ? pp.h1 + (size_t)row * 2 * I : tok < s().tokens ? pp.hs + (size_t)tok * 2 * I : nullptr;
      bf16_t* d = pp.dh1 + (size_t)row * 2 * I;
#pragma unroll
      for (int j = 0; j < Dg::kSub; ++j) {
        const int col = t.n * Dg::kBN + Dg::acc_col(j);
        if (col >= I) continue;
        const float g = pre != nullptr ? to_f32(pre[col]) : 0.f, u = pre != nullptr ? to_f32(pre[I + col]) : 0.f;
        float dg, du;
        moe_swiglu_bwd(acc.v[i][j], g, u, &dg, &du);
        d[col] = from_f32<bf16_t>(dg);
        d[I + col] = from_f32<bf16_t>(du);
      }
    }
  }

  // dX_rows' rows of t.rb, columns [128 t.n, + 128): dh1 @ w1[x]^T (the shared expert: its own gate | up).
  KOSMOS_DEVICE void dx_tile(const MoeTile& t) {
    const int H = p().H, I = p().I;
    const gemm::bf16* w1 = shared(t) ? elems(pp.sw1) : elems(pp.w1) + (size_t)t.x * H * 2 * I;
    MoePortableDgradHooks h{elems(pp.dh1), rows(), 0};
    Dg::tile(gemm::Problem{pp.dh1, w1, p().y_rows, rows(), H, 2 * I}, {t.rb, t.n}, sm.tile, h);
  }

  // Block t.n of expert t.x's dW2 (gemm 2: act^T @ dY rows, [I, H]) or dW1
  // (gemm 1: x rows^T @ dh1, [H, 2I]), summed over the expert's rows.
  KOSMOS_DEVICE void wgrad_tile(const MoeTile& t, int gemm) {
    const int H = p().H, I = p().I;
    const bool sh = shared(t);
    int first, last;
    moe_expert_row_blocks(s(), layout(), t.x, &first, &last);
    const size_t lo = (size_t)first * kMoeTileRows;
    const int K = sh ? s().tokens : (last - first) * kMoeTileRows;
    const int M = gemm == 2 ? I : H, N = gemm == 2 ? H : 2 * I, cols = gemm == 2 ? pp.w.cols2 : pp.w.cols1;
    const gemm::bf16* a = gemm == 2 ? elems(pp.act) + lo * I : sh ? elems(pp.x) : elems(pp.x_rows) + lo * H;
    const gemm::bf16* b = gemm == 1 ? elems(pp.dh1) + lo * 2 * I : sh ? elems(p().x) : elems(p().arena) + lo * H;
    bf16_t* c = gemm == 2 ? (sh ? pp.dsw2 : pp.dw2 + (size_t)t.x * I * H) : (sh ? pp.dsw1 : pp.dw1 + (size_t)t.x * H * 2 * I);
    MoePortableWgradHooks h{a, M};
    Wg::tile(gemm::Problem{a, b, c, M, N, K}, {t.n / cols, t.n % cols}, sm.tile, h);
  }
};

// One CTA per SM (the launcher pads shared memory so no second CTA fits).
template <typename T>
__global__ void __launch_bounds__(portable::kThreads, 1) moe_bwd_portable_kernel(const MoeBwdPortableParams<T> p) {
  __shared__ MoePortableShared sm;
  const MoeCtl ctl{&p.m, launch_epoch(&p.m.ctrl->epoch), (int)blockIdx.x, "moe_backward"};
  MoePortableBwdOps<T> ops{{ctl, &sm.bc, sm.scratch}, p, sm};
  moe_fwd_cta(ops, p.m.s, (int)blockIdx.x, (int)gridDim.x, p.m.movers, p.m.switching != 0);
}

// The problem's shape, or "" when this kernel runs it (the handler names values).
inline const char* moe_bwd_portable_unsupported(int H, int I, int E, int k) {
  if (I <= 0) return "expert_intermediate must be positive";
  return moe_cta_unsupported(H, E, k);
}

// Launches over p.m (its workspace zeroed where moe_bwd_ws_layout says, m.s.nt1 /
// nt2 from moe_portable_bwd_columns) with `grid` CTAs, `pad_smem` bytes of
// dynamic shared memory (only padding: one CTA per SM).
inline kosmosError_t moe_bwd_portable_launch(const MoeBwdPortableParams<bf16_t>& p, int grid, size_t pad_smem,
                                             kosmosStream_t stream) {
  moe_bwd_portable_kernel<bf16_t><<<grid, portable::kThreads, pad_smem, stream>>>(p);
  return kosmosGetLastError();
}

}  // namespace kosmos::moe
