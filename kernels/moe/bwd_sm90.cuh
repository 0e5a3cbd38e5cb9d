// The MoE backward megakernel with Hopper builders (sm_90a), EP = 1 (paper
// §3.3.2): the forward's CTA life (moe_fwd_cta, moe/fwd_sched.h) over the
// forward's device ops (moe/fwd_ops.cuh) with the backward's build queue
// (MoeBwdBuilds, moe/bwd_queues.h). The ops' words mean the backward's:
//
//   x       dY [t, H]; the dispatch gathers each pair's dY row into the arena
//           (output gating: w * dY, rounded once; input gating: dY), padding zeroed
//   arena   the pairs' dY rows [R, H], in the forward's arena order (the front
//           recomputes the forward's plan from the same routing)
//   y_rows  dX_rows [R, H]: dgrad1's, each pair's gradient of its expert input
//   y       dX [t, H]: the fold of a token's k dX rows (output gating: weight 1;
//           input gating: its router weight, d(w x) / dx)
//
// Build tiles (four engine passes' kinds; one engine run serves one GEMM, so
// a claim of another kind ends the pass, as in the forward's build()):
//   1 dgrad2  dh1 [R, 2I] from dY_rows @ W2[e]^T and the forward's h1, the
//             SwiGLU backward in the epilogue (moe/swiglu_bwd_sm90.cuh)
//   2 dgrad1  dX_rows = dh1 @ W1[e]^T
//   3 wgrad2  dW2[e] = act[rows of e]^T @ dY_rows[rows of e]
//   4 wgrad1  dW1[e] = x_rows[rows of e]^T @ dh1[rows of e]
// dgrads on the engine's NN layout (B K-major, each expert's rows from
// b_row0), wgrads on NT with each expert's contraction rows as the tile's k
// range (k_range): the plan's stable row order, so dW is bitwise reproducible.
// The forward's workspace supplies x_rows, act and h1 (moe/fwd_ws.h; their
// padding rows are zeros, as the dY arena's, so whole row blocks contract).
//
// The shared expert's row blocks follow the arena's, as in the forward: its
// dgrad2 tiles read dY itself and its pre-activations hs, its dgrad1 tiles
// its own gate | up, its wgrad tiles dY's and x's token rows against its
// arena rows of act and dh1 (k_range's two starts), and the fold adds its dX
// row with weight 1. Its dW leave through their own store boxes (dsw1, dsw2).
//
// Not here yet: the router and routing-weight gradients (XLA), EP > 1.
#pragma once
#include "gemm/sm90/tile_engine.cuh"
#include "moe/bwd_queues.h"
#include "moe/fwd_ops.cuh"
#include "moe/swiglu_bwd_sm90.cuh"

namespace kosmos::moe {

template <class Dg, class Wg>
struct MoeBwdSm90Params {
  MoeFwdParams m;       // the CTA life's words, as above (s.shared_blocks == 0)
  sm90::Params<Dg> d2;  // dgrad2: A dY rows [R, H], B w2 as [E * I, H]: N = I, K = H
  sm90::Params<Dg> d1;  // dgrad1: A dh1 [R, 2I], B w1 as [E * H, 2I], C dX rows [R, H]: N = H, K = 2I
  sm90::Params<Wg> g2;  // wgrad2: A act as (I, R), B dY rows as (H, R), C dW2 [E * I, H]: K = R
  sm90::Params<Wg> g1;  // wgrad1: A x rows as (H, R), B dh1 as (2I, R), C dW1 [E * H, 2I]: K = R
  typename sm90::Params<Dg>::TmaC dgate, dup;  // dh1's gate and up columns: [R + S, I] each, row pitch 2I
  const bf16_t* h1;     // [R][2I] the forward's pre-activations
  MoeWgradTiles w;      // with cols2, cols1
  // The shared expert's (s.shared_blocks > 0; else copies of the routed ones):
  typename sm90::Params<Dg>::TmaA dy_in;  // dgrad2's A: dY [t, H]
  typename sm90::Params<Dg>::TmaB sw2;    // dgrad2's B: its down [I, H]
  typename sm90::Params<Dg>::TmaB sw1;    // dgrad1's B: its gate | up [H, 2I]
  typename sm90::Params<Wg>::TmaA x_mn;   // wgrad1's A: x [t, H] as (H, t)
  typename sm90::Params<Wg>::TmaB dy_mn;  // wgrad2's B: dY [t, H] as (H, t)
  const bf16_t* hs;                       // [t][2I] its pre-activations (the forward's)
  typename sm90::Params<Wg>::TmaC dsw2, dsw1;  // its dW2 [I, H] and dW1 [H, 2I]
};

// The engine's scheduler for one pass of kind kKind (producer thread only):
// MoePassSched's, with the backward's tile coordinates.
template <int kKind>
struct MoeBwdPassSched {
  MoeBwdBuilds<MoeCtl>* b;
  MoePass* pass;
  int most;
  KOSMOS_DEVICE bool next(gemm::TileCoord& t) {
    if (pass->pending.gemm == 0) {
      if (most >= 0 && pass->ran >= most) return false;
      if (!b->next(&pass->pending)) return false;
    }
    if (pass->pending.gemm != kKind) return false;  // the other kind's pass starts with it
    moe_bwd_coord(b->w, pass->pending, &t.m, &t.n);
    pass->pending.gemm = 0;
    ++pass->ran;
    return true;
  }
};

// dgrad2 (kKind 1) and dgrad1 (2): a row block's tile waits as the forward's
// GEMM1 / GEMM2 tile does (its rows arrived; its row block's dgrad2 done) and
// completes the same flags.
template <class Dg, class Wg, int kKind>
struct MoeBwdDgradHooks {
  static constexpr bool kTileDone = true, kRowsB = true, kMapsRows = kKind == 1, kStoreBoxes = kKind == 1;
  static constexpr bool kSplitA = kKind == 1, kBSource = true;  // the shared expert's dY, and weights
  using TmaA = typename sm90::Params<Dg>::TmaA;
  using TmaB = typename sm90::Params<Dg>::TmaB;
  using TmaC = typename sm90::Params<Dg>::TmaC;
  const MoeBwdSm90Params<Dg, Wg>* p;
  MoeBwdBuilds<MoeCtl>* b;

  KOSMOS_DEVICE bool shared(gemm::TileCoord t) const { return moe_shared_rb(b->s, t.m); }
  KOSMOS_DEVICE int expert(gemm::TileCoord t) const { return moe_tile_expert(b->s, b->L, t.m); }
  // dgrad2 of the shared expert: dY's token rows (past t: zeros, computed and never read).
  KOSMOS_DEVICE const TmaA* a_source(gemm::TileCoord t, int* rows, int* tile_m) const {
    if (!shared(t)) return nullptr;
    *rows = b->s.tokens;
    *tile_m = t.m - b->s.shared_rb0;
    return &p->dy_in;
  }
  KOSMOS_DEVICE const TmaB* b_source(gemm::TileCoord t) const {
    return !shared(t) ? nullptr : kKind == 1 ? &p->sw2 : &p->sw1;
  }
  KOSMOS_DEVICE void before_tile(gemm::TileCoord t) {
    b->start(MoeTile{kKind, t.m, expert(t), t.n});
    gemm::async_proxy_fence();
  }
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(gemm::TileCoord t) { b->done(MoeTile{kKind, t.m, 0, t.n}); }
  KOSMOS_DEVICE int b_row0(gemm::TileCoord t) const {
    return shared(t) ? 0 : expert(t) * (kKind == 1 ? p->m.I : p->m.H);
  }
  // dgrad2's two tiles of dh1 and the pre-activations they need.
  KOSMOS_DEVICE sm90::StoreBox<TmaC> store_box(gemm::TileCoord t) const {
    return {&p->dup, p->m.rbs * Dg::kBM, p->m.I, t.m, t.n * Dg::kBN};
  }
  KOSMOS_DEVICE sm90::StoreBox<TmaC> gate_box(gemm::TileCoord t) const {
    return {&p->dgate, p->m.rbs * Dg::kBM, p->m.I, t.m, t.n * Dg::kBN};
  }
  // h1's arena row, or hs's token row (the shared expert's; none past t).
  KOSMOS_DEVICE const gemm::bf16* preact_row(gemm::TileCoord t, int r) const {
    if (!shared(t)) return reinterpret_cast<const gemm::bf16*>(p->h1) + (size_t)(t.m * Dg::kBM + r) * 2 * p->m.I;
    const int tok = (t.m - b->s.shared_rb0) * Dg::kBM + r;
    return tok < b->s.tokens ? reinterpret_cast<const gemm::bf16*>(p->hs) + (size_t)tok * 2 * p->m.I : nullptr;
  }
  KOSMOS_DEVICE int preact_cols() const { return p->m.I; }
  // Unreachable: dgrad2's tiles leave through their store boxes.
  template <class OutT>
  KOSMOS_DEVICE OutT* row_ptr(gemm::TileCoord, int) const {
    trap();
  }
};

// wgrad2 (kKind 3) and wgrad1 (4): tile row m is row block m % per of expert
// m / per's dW; it waits for every dgrad2 tile of the expert's row blocks and
// contracts them (none: zeros). Nothing waits on a wgrad tile. The shared
// expert (x = e_local) contracts its arena rows of act (wgrad2) or dh1
// (wgrad1) against dY's or x's token rows.
template <class Dg, class Wg, int kKind>
struct MoeBwdWgradHooks {
  static constexpr bool kTileDone = false, kSplitA = true, kKRange = true, kBSource = true;
  static constexpr bool kMapsRows = true, kStoreBoxes = true;  // the shared expert's dW have arrays of their own
  using TmaA = typename sm90::Params<Wg>::TmaA;
  using TmaB = typename sm90::Params<Wg>::TmaB;
  using TmaC = typename sm90::Params<Wg>::TmaC;
  const MoeBwdSm90Params<Dg, Wg>* p;
  MoeBwdBuilds<MoeCtl>* b;

  KOSMOS_DEVICE int rows() const { return kKind == 3 ? p->m.I : p->m.H; }  // dW's rows per expert
  KOSMOS_DEVICE bool shared(gemm::TileCoord t) const { return t.m / (rows() / Wg::kBM) == b->s.e_local; }
  KOSMOS_DEVICE const TmaB* b_source(gemm::TileCoord t) const {
    return kKind == 3 && shared(t) ? &p->dy_mn : nullptr;
  }
  KOSMOS_DEVICE sm90::StoreBox<TmaC> store_box(gemm::TileCoord t) const {
    const sm90::Params<Wg>& g = kKind == 3 ? p->g2 : p->g1;
    if (shared(t)) return {kKind == 3 ? &p->dsw2 : &p->dsw1, rows(), g.N, t.m % (rows() / Wg::kBM), t.n * Wg::kBN};
    return {&g.tma_c, g.M, g.N, t.m, t.n * Wg::kBN};
  }
  // Unreachable: every tile leaves through its store boxes.
  template <class OutT>
  KOSMOS_DEVICE OutT* row_ptr(gemm::TileCoord, int) const {
    trap();
  }
  KOSMOS_DEVICE void before_tile(gemm::TileCoord t) {
    b->start(MoeTile{kKind, -1, t.m / (rows() / Wg::kBM), 0});
    gemm::async_proxy_fence();
  }
  KOSMOS_DEVICE void before_k(gemm::TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(gemm::TileCoord) {}
  KOSMOS_DEVICE const TmaA* a_source(gemm::TileCoord t, int* a_rows, int* tile_m) const {
    *a_rows = rows();
    *tile_m = t.m % (rows() / Wg::kBM);
    return kKind == 3 ? &p->g2.tma_a : shared(t) ? &p->x_mn : &p->g1.tma_a;
  }
  KOSMOS_DEVICE void k_range(gemm::TileCoord t, int* a_kb0, int* b_kb0, int* kblocks) const {
    constexpr int kPer = Wg::kBM / Wg::kBK;  // k-blocks per row block
    if (shared(t)) {  // its arena rows from shared_rb0 against token rows from 0
      const int arena = b->s.shared_rb0 * kPer;
      *a_kb0 = kKind == 3 ? arena : 0;
      *b_kb0 = kKind == 3 ? 0 : arena;
      *kblocks = b->s.shared_blocks * kPer;
      return;
    }
    const int x = t.m / (rows() / Wg::kBM), lo = b->L.rb[x], hi = b->L.rb[x + 1];
    *a_kb0 = *b_kb0 = lo * kPer;
    *kblocks = (hi - lo) * kPer;
  }
};

template <class Dg, class Wg>
struct MoeBwdSm90Ops : MoeLocalOps {
  static_assert(sizeof(sm90::SharedStorage<Dg>) == sizeof(sm90::SharedStorage<Wg>),
                "the two layouts' engines share one CTA's shared memory");
  const MoeBwdSm90Params<Dg, Wg>& pp;
  char* smem;  // the kernel's dynamic shared memory (unaligned: shared_storage aligns it)
  MoePass* pass;

  template <int kKind>
  KOSMOS_DEVICE void run_pass(MoeBwdBuilds<MoeCtl>& b, int most) {
    MoeBwdPassSched<kKind> sched{&b, pass, most};
    if constexpr (kKind <= 2) {
      using Hooks = MoeBwdDgradHooks<Dg, Wg, kKind>;
      Hooks h{&pp, &b};
      auto& s = sm90::shared_storage<Dg>(smem);
      if constexpr (kKind == 1) {
        sm90::TileEngine<Dg, gemm::bf16, Hooks, SwigluBwdStaging>::run(pp.d2, s, sched, h);
      } else {
        sm90::TileEngine<Dg, gemm::bf16, Hooks>::run(pp.d1, s, sched, h);
      }
    } else {
      using Hooks = MoeBwdWgradHooks<Dg, Wg, kKind>;
      Hooks h{&pp, &b};
      sm90::TileEngine<Wg, gemm::bf16, Hooks>::run(kKind == 3 ? pp.g2 : pp.g1, sm90::shared_storage<Wg>(smem), sched, h);
    }
  }

  // Up to `most` tiles of the backward's build queue (< 0: until it is empty), as passes.
  KOSMOS_DEVICE int build(const MoeLayout& L, int most) {
    MoeCtl one = ctl;
    MoeBwdBuilds<MoeCtl> b{one, s(), L, pp.w};
    if (threadIdx.x == 0) pass->pending.gemm = 0, pass->ran = 0;
    __syncthreads();
    for (;;) {
      if (threadIdx.x == 0 && pass->pending.gemm == 0 && (most < 0 || pass->ran < most)) b.next(&pass->pending);
      __syncthreads();
      const int kind = pass->pending.gemm, ran = pass->ran;
      __syncthreads();  // read before thread 0 writes the pass again
      if (kind == 0) return ran;
      const TraceSpan span;
      switch (kind) {
        case 1: run_pass<1>(b, most); break;
        case 2: run_pass<2>(b, most); break;
        case 3: run_pass<3>(b, most); break;
        default: run_pass<4>(b, most); break;
      }
      __syncthreads();  // the engine's threads return at different times
      if (threadIdx.x == 0) span.close(p().trace, ctl.cta, kTraceBuild, kind);
    }
  }
};

template <class Dg, class Wg>
__global__ void __launch_bounds__(Dg::kThreads, 1) moe_bwd_sm90_kernel(const __grid_constant__ MoeBwdSm90Params<Dg, Wg> p) {
  static_assert(Dg::kThreads == kMoeThreads && Dg::kBM == kMoeTileRows && Wg::kBM == kMoeTileRows,
                "the CTA and row block of moe/fwd_ops.cuh");
  static_assert(sizeof(sm90::SharedStorage<Dg>::a) >= kMoeScratchInts * sizeof(int), "the front's scratch fits the A ring");
  extern __shared__ char smem_raw[];
  __shared__ int bc;
  __shared__ MoePass pass;
  auto& s = sm90::shared_storage<Dg>(smem_raw);
  const MoeCtl ctl{&p.m, launch_epoch(&p.m.ctrl->epoch), (int)blockIdx.x};
  // The front's scratch is the engines' A ring: no engine runs during the front.
  MoeBwdSm90Ops<Dg, Wg> ops{{ctl, &bc, reinterpret_cast<int*>(s.a)}, p, smem_raw, &pass};
  moe_fwd_cta(ops, p.m.s, (int)blockIdx.x, (int)gridDim.x, p.m.movers, p.m.switching != 0);
}

// The problem's shape, or "" when this kernel runs it (the handler names values).
inline const char* moe_bwd_sm90_unsupported(int H, int I, int E, int k) {
  if (H <= 0 || H % 128) return "hidden must be a positive multiple of 128 (wgrad1's tile rows of dW1)";
  if (I <= 0 || I % 128) return "expert_intermediate must be a positive multiple of 128 (wgrad2's tile rows of dW2)";
  if (E < 1 || E > kMaxExperts) return "num_experts must be in [1, 512]";
  if (k < 1 || k > 32 || k > E) return "top_k must be in [1, min(32, num_experts)] (the fold's warp holds a token's rows)";
  return "";
}

// The weight-gradient tiles of one expert for the engine's tile widths.
template <class Wg>
MoeWgradTiles moe_bwd_wgrad_tiles(int H, int I) {
  const int cols2 = (H + Wg::kBN - 1) / Wg::kBN, cols1 = (2 * I + Wg::kBN - 1) / Wg::kBN;
  return {I / Wg::kBM * cols2, H / Wg::kBM * cols1, cols2, cols1};
}

// Launches over m (its workspace zeroed where moe_bwd_ws_layout says; m.x dY,
// m.arena and m.y_rows the backward's dY and dX rows) with `grid` CTAs. x_rows
// [R, H], act [R + S, I] and h1 [R, 2I] are the forward's (its workspace);
// dh1 [R + S, 2I] scratch; dw1 [E, H, 2I] and dw2 [E, I, H] the weight
// gradients. With a shared expert (m.s.shared_blocks > 0): x [t, H] the
// forward's input, hs [t, 2I] its pre-activations, sw1 [H, 2I] and sw2 [I, H]
// its weights, dsw1 and dsw2 their gradients.
template <class Dg, class Wg>
cudaError_t moe_bwd_sm90_launch(const MoeFwdParams& m, const void* w1, const void* w2, const void* x_rows,
                                const void* act, const void* h1, void* dh1, void* dw1, void* dw2, const void* x,
                                const void* hs, const void* sw1, const void* sw2, void* dsw1, void* dsw2, int grid,
                                cudaStream_t stream) {
  using sm90::make_operand_tma;
  using sm90::make_output_tma;
  using sm90::bf16;
  const bool shared = m.s.shared_blocks > 0;
  const int R = m.s.shared_rb0 * Dg::kBM, RS = m.rbs * Dg::kBM, H = m.H, I = m.I, t = m.s.tokens;
  const int E = moe_experts(m.s);
  const auto* dy_rows = reinterpret_cast<const bf16*>(m.arena);
  const auto* dy = reinterpret_cast<const bf16*>(m.x);
  const auto* pdh1 = static_cast<const bf16*>(dh1);
  const auto* pw1 = static_cast<const bf16*>(w1);
  const auto* pw2 = static_cast<const bf16*>(w2);
  const auto* psw1 = shared ? static_cast<const bf16*>(sw1) : pw1;
  const auto* psw2 = shared ? static_cast<const bf16*>(sw2) : pw2;
  const auto* px = shared ? static_cast<const bf16*>(x) : dy;
  MoeBwdSm90Params<Dg, Wg> p{
      m,
      {make_operand_tma<Dg::kMajorA, typename Dg::RingA>(dy_rows, R, H, H),
       make_operand_tma<Dg::kMajorB, typename Dg::RingB>(pw2, E * I, H, H), {}, nullptr, RS, I, H},
      {make_operand_tma<Dg::kMajorA, typename Dg::RingA>(pdh1, RS, 2 * I, 2 * I),
       make_operand_tma<Dg::kMajorB, typename Dg::RingB>(pw1, E * H, 2 * I, 2 * I),
       make_output_tma<Dg>(m.y_rows, RS, H, H), m.y_rows, RS, H, 2 * I},
      {make_operand_tma<Wg::kMajorA, typename Wg::RingA>(static_cast<const bf16*>(act), I, RS, I),
       make_operand_tma<Wg::kMajorB, typename Wg::RingB>(dy_rows, H, R, H), make_output_tma<Wg>(dw2, E * I, H, H),
       dw2, E * I, H, RS},
      {make_operand_tma<Wg::kMajorA, typename Wg::RingA>(static_cast<const bf16*>(x_rows), H, R, H),
       make_operand_tma<Wg::kMajorB, typename Wg::RingB>(pdh1, 2 * I, RS, 2 * I),
       make_output_tma<Wg>(dw1, E * H, 2 * I, 2 * I), dw1, E * H, 2 * I, RS},
      make_output_tma<Dg>(dh1, RS, I, 2 * I),
      make_output_tma<Dg>(static_cast<bf16*>(dh1) + I, RS, I, 2 * I),
      static_cast<const bf16_t*>(h1),
      moe_bwd_wgrad_tiles<Wg>(H, I),
      make_operand_tma<Dg::kMajorA, typename Dg::RingA>(dy, t, H, H),
      make_operand_tma<Dg::kMajorB, typename Dg::RingB>(psw2, I, H, H),
      make_operand_tma<Dg::kMajorB, typename Dg::RingB>(psw1, H, 2 * I, 2 * I),
      make_operand_tma<Wg::kMajorA, typename Wg::RingA>(px, H, t, H),
      make_operand_tma<Wg::kMajorB, typename Wg::RingB>(dy, H, t, H),
      static_cast<const bf16_t*>(shared ? hs : h1),
      make_output_tma<Wg>(shared ? dsw2 : dw2, I, H, H),
      make_output_tma<Wg>(shared ? dsw1 : dw1, H, 2 * I, 2 * I)};
  moe_bwd_sm90_kernel<Dg, Wg><<<grid, Dg::kThreads, sm90::SharedStorage<Dg>::kLaunchBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kosmos::moe
