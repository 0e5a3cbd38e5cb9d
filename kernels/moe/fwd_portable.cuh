// The MoE forward megakernel with portable builders, EP = 1: the CTA life
// moe_fwd_cta (moe/fwd_sched.h) over the device ops of moe/fwd_ops.cuh, whose
// build() runs the build queue's tiles one at a time (moe_build_serial: claim,
// wait for the tile's rows, compute, count its row block) on the portable tile
// engine (gemm/portable/tile_engine.cuh: 256 threads, 128 x 128 tiles, fp32 FMA
// in ascending k), single-source CUDA/HIP, so the kernel runs on any CUDA GPU
// and compiles for AMD's. The Hopper kernel (moe/fwd_sm90.cuh) runs the same
// schedule, queues and workspace; only the tiles' widths differ, so the handler
// sets the shape's nt1 / nt2 per engine (moe_portable_nt1 / _nt2 here).
//
// The shared expert's tiles (row blocks from shared_rb0) read x as GEMM1's A
// and its own weights as B, and keep their pre-activations in hs.
//
// GEMM1 tile (rb, n): act columns [64 n, + 64) of row block rb. Its engine tile
// reads B as two half-blocks of the expert's w1 [H, 2I] (the split-B hook):
// gate columns [64 n, + 64) beside the same up columns, I further on. A
// thread's accumulator column j < kSub / 2 is then gate column c and column
// j + kSub / 2 up column c (the engine's acc_col), so the SwiGLU (moe_swiglu,
// the Hopper epilogue's arithmetic) runs on the thread's own registers and
// h is rounded to bf16 once. GEMM2 tile (rb, n): y_rows columns [128 n, + 128)
// of act @ w2[e], stored by the engine (rounded once).
//
// Memory model. start() acquires a tile's rows CTA-wide before the engine
// loads them (thread 0 waits, then a CTA barrier): GEMM1 the arena rows the
// movers gathered (kArrived), GEMM2 the act rows other CTAs' GEMM1 tiles
// stored (kGemm1). The engine reads that A through a_source, L2-only, as every
// row written during a launch is read; generic-proxy loads (no TMA), so no
// proxy fence. done()
// counts the tile after a CTA barrier and thread 0's fence (MoeLocalOps::count)
// and the completing count releases the row block's flag the same way.
#pragma once
#include <cstddef>
#include <type_traits>

#include "gemm/portable/tile_engine.cuh"
#include "gemm/tile_hooks.h"
#include "kosmos/trace.h"
#include "moe/fwd_ops.cuh"
#include "moe/swiglu.h"

namespace kosmos::moe {

using MoePortableEngine = portable::TileEngine<gemm::Layout::TN, gemm::bf16, gemm::bf16>;
static_assert(MoePortableEngine::kBM == kMoeTileRows, "a GEMM row block is one engine tile row");

// Columns per tile: GEMM1's of act (a gate and an up half-block), GEMM2's of y_rows.
constexpr int kMoePortableCols1 = portable::kBN / 2, kMoePortableCols2 = portable::kBN;
KOSMOS_HD inline int moe_portable_nt1(int I) { return I / kMoePortableCols1; }
KOSMOS_HD inline int moe_portable_nt2(int H) { return (H + kMoePortableCols2 - 1) / kMoePortableCols2; }

template <typename T>
struct MoeFwdPortableParams {
  static_assert(std::is_same_v<T, bf16_t>, "the MoE forward runs bf16 (MoeFwdParams' rows)");
  MoeFwdParams m;
  const T* w1;   // [E][H][2I]: gate | up
  const T* w2;   // [E][I][H]
  const T* sw1;  // [H][2I] the shared expert's (m.s.shared_blocks > 0)
  const T* sw2;  // [I][H]
};

static_assert(portable::kThreads <= kMoeThreads, "the CTA-wide ops' scratch is sized for kMoeThreads");

// The kernel's shared state: the claims' broadcast cell, and the engine's
// staging overlaid with the front's scratch (no tile runs during the front) and
// the fold's (MoeLocalOps::fold, one stage a warp: no shared memory to spare).
struct MoePortableShared {
  int bc;
  union {
    portable::EngineSmem tile;
    int scratch[kMoeScratchInts];
    uint4 fold[moe_fold_smem_bytes(kMoeFoldMaxTokens, 1, portable::kThreads / 32) / 16];  // from scratch: 1 stage
  };
};

// One tile's hooks (gemm/tile_hooks.h). start() has acquired the rows, so the
// hooks wait for nothing; a_source names A (the arena or act, R rows) so that
// the engine reads it L2-only; GEMM1's b_halves pairs the gate and up blocks.
template <int kGemm>
struct MoePortableHooks {
  static constexpr bool kTileDone = false, kMapsRows = false, kSplitA = true, kSplitB = kGemm == 1;
  const gemm::bf16* a;  // [rows][K]: the arena or act, or (the shared expert's GEMM1) x
  const gemm::bf16* b;  // the tile's expert's w1 [H][2I] or w2 [I][H]
  int rows;             // a's rows
  int m0;               // the tile row of a's row 0 (the shared expert's GEMM1: shared_rb0)
  int up_half;          // GEMM1: I / 64, the half-block where the up columns start

  KOSMOS_DEVICE void before_tile(gemm::TileCoord) {}
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(gemm::TileCoord) {}
  KOSMOS_DEVICE const gemm::bf16* a_source(gemm::TileCoord t, int* a_rows, int* tile_m) const {
    *a_rows = rows;
    *tile_m = t.m - m0;
    return a;
  }
  KOSMOS_DEVICE const gemm::bf16* b_halves(gemm::TileCoord t, int* lo, int* hi) const {
    *lo = t.n;
    *hi = up_half + t.n;
    return b;
  }
};

template <typename T>
struct MoePortableOps : MoeLocalOps {
  const MoeFwdPortableParams<T>& pp;
  MoePortableShared& sm;

  KOSMOS_DEVICE int rows() const { return p().rbs * kMoeTileRows; }
  // The engine's element type: the same bits (CUDA, HIP) under its own name.
  KOSMOS_DEVICE const gemm::bf16* elems(const bf16_t* q) const { return reinterpret_cast<const gemm::bf16*>(q); }

  // Up to `most` tiles of the build queue (< 0: until it is empty), one at a time.
  KOSMOS_DEVICE int build(const MoeLayout& L, int most) {
    return moe_build_serial(MoeBuilds<MoePortableOps>{*this, s(), L}, most);
  }
  // One tile (a build span per tile: the Hopper engine's are per pass).
  KOSMOS_DEVICE void gemm1(const MoeTile& t) {
    const TraceSpan span;
    swiglu_tile(t);
    if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceBuild, 1);
  }
  KOSMOS_DEVICE void gemm2(const MoeTile& t) {
    const TraceSpan span;
    down_tile(t);
    if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceBuild, 2);
  }

  // act's rows of t.rb, columns [64 t.n, + 64): silu(gate) * up, rounded once,
  // and (h1 set: kept) their bf16 pre-activations for the backward (h1's
  // arena rows, the shared expert's hs: gate columns, then up, I further on).
  // The shared expert's tiles read x and its own weights.
  KOSMOS_DEVICE void swiglu_tile(const MoeTile& t) {
    using E = MoePortableEngine;
    const int H = p().H, I = p().I, m0 = s().shared_rb0;
    const bool shared = t.x == s().e_local;
    const gemm::bf16* w1 = shared ? elems(pp.sw1) : elems(pp.w1) + (size_t)t.x * H * 2 * I;
    MoePortableHooks<1> h{shared ? elems(p().x) : elems(p().arena), w1, shared ? s().tokens : m0 * E::kBM,
                          shared ? m0 : 0, I / kMoePortableCols1};
    const E::Acc acc = E::mainloop(gemm::Problem{p().arena, w1, p().act, rows(), 2 * I, H}, {t.rb, t.n}, sm.tile, h);
    static_assert(E::kSub * 16 == E::kBN, "acc_col(j + kSub / 2) == acc_col(j) + kBN / 2");
#pragma unroll
    for (int i = 0; i < E::kSub; ++i) {
      const int row = t.rb * E::kBM + E::acc_row(i), tok = row - m0 * E::kBM;
      bf16_t* out = p().act + (size_t)row * I + t.n * kMoePortableCols1;
      bf16_t* pre = p().h1 == nullptr    ? nullptr
                    : !shared            ? p().h1 + (size_t)row * 2 * I + t.n * kMoePortableCols1
                    : tok < s().tokens   ? p().hs + (size_t)tok * 2 * I + t.n * kMoePortableCols1
                                         : nullptr;
#pragma unroll
      for (int j = 0; j < E::kSub / 2; ++j) {
        const float g = acc.v[i][j], u = acc.v[i][j + E::kSub / 2];
        out[E::acc_col(j)] = from_f32<bf16_t>(moe_swiglu(g, u));
        if (pre != nullptr) pre[E::acc_col(j)] = from_f32<bf16_t>(g), pre[I + E::acc_col(j)] = from_f32<bf16_t>(u);
      }
    }
  }

  // y_rows' rows of t.rb, columns [128 t.n, + 128): act @ w2[x] (the shared expert: its own down).
  KOSMOS_DEVICE void down_tile(const MoeTile& t) {
    const int H = p().H, I = p().I;
    const gemm::bf16* w2 = t.x == s().e_local ? elems(pp.sw2) : elems(pp.w2) + (size_t)t.x * I * H;
    MoePortableHooks<2> h{elems(p().act), w2, rows(), 0, 0};
    MoePortableEngine::tile(gemm::Problem{p().act, w2, p().y_rows, rows(), H, I}, {t.rb, t.n}, sm.tile, h);
  }
};

// One CTA per SM (the launcher pads shared memory so no second CTA fits).
template <typename T>
__global__ void __launch_bounds__(portable::kThreads, 1) moe_fwd_portable_kernel(const MoeFwdPortableParams<T> p) {
  __shared__ MoePortableShared sm;
  const MoeCtl ctl{&p.m, launch_epoch(&p.m.ctrl->epoch), (int)blockIdx.x};
  MoePortableOps<T> ops{{ctl, &sm.bc, sm.scratch}, p, sm};
  moe_fwd_cta(ops, p.m.s, (int)blockIdx.x, (int)gridDim.x, p.m.movers, p.m.switching != 0);
}

// The problem's shape, or "" when this kernel runs it (the handler's checks name values).
inline const char* moe_fwd_portable_unsupported(int H, int I, int E, int k) {
  if (I <= 0 || I % kMoePortableCols1)
    return "expert_intermediate must be a positive multiple of 64 (GEMM1's gate and up half-blocks)";
  return moe_cta_unsupported(H, E, k);
}

// Launches over m (its workspace zeroed where moe_ws_layout says, m.s.nt1 / nt2
// from moe_portable_nt1 / _nt2) with `grid` CTAs, `pad_smem` bytes of dynamic
// shared memory (only padding: one CTA per SM).
inline kosmosError_t moe_fwd_portable_launch(const MoeFwdParams& m, const void* w1, const void* w2, const void* sw1,
                                             const void* sw2, int grid, size_t pad_smem, kosmosStream_t stream) {
  const MoeFwdPortableParams<bf16_t> p{m, static_cast<const bf16_t*>(w1), static_cast<const bf16_t*>(w2),
                                       static_cast<const bf16_t*>(sw1), static_cast<const bf16_t*>(sw2)};
  moe_fwd_portable_kernel<bf16_t><<<grid, portable::kThreads, pad_smem, stream>>>(p);
  return kosmosGetLastError();
}

}  // namespace kosmos::moe
