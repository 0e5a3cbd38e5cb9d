// The MoE forward megakernel with Hopper builders (sm_90a), EP = 1: the CTA
// life moe_fwd_cta (moe/fwd_sched.h) over the device ops of moe/fwd_ops.cuh,
// whose build() drives the TMA + WGMMA tile engine with the build queue
// (MoeBuilds): GEMM1 tiles (gate and up column blocks of one expert's
// weights, the SwiGLU in the epilogue: moe/swiglu_sm90.cuh) into act, then
// GEMM2 tiles (act @ down[e]) into y_rows. The shared expert's tiles are the
// same GEMMs over row blocks past the arena: the hooks point their A at x
// (GEMM1) and their B at the shared weights. Every GEMM1 tile keeps its bf16
// pre-activations (routed: h1, the shared expert's: hs) for the backward.
//
// One engine run serves one GEMM (its operands are TMA descriptors of the
// run), so build() runs passes: the engine's claimer thread claims ahead, and a claim
// of the other GEMM ends the pass and opens the next one with it. GEMM1 tiles
// precede GEMM2 tiles in the queue, so a CTA makes at most one GEMM1 and one
// GEMM2 pass per build (a two-way mover's build of one tile is one short pass).
// A pass ends with every tile's stores landed and published (the engine's
// retire at exit), so a GEMM2 tile never waits on its own CTA's GEMM1 tile.
#pragma once
#include "gemm/sm90/tile_engine.cuh"
#include "moe/fwd_ops.cuh"
#include "moe/sm90_ops.cuh"
#include "moe/swiglu_sm90.cuh"

namespace kosmos::moe {

template <class Cfg>
struct MoeFwdSm90Params {
  using P = sm90::Params<Cfg>;
  MoeFwdParams m;
  P g1;  // A arena [R, H], B w1 [E*H, 2I]: M = R, N = 2I, K = H
  P g2;  // A act [R + S, I], B w2 [E*I, H], C y_rows [R + S, H]: N = H, K = I
  typename P::TmaBHalf w1_half;   // w1 in half-height boxes: a gate and an up column block
  typename P::TmaC act_out;       // the SwiGLU tiles' stores into act [R + S, I]
  // The shared expert's row blocks (s.shared_blocks > 0; else copies of the above):
  typename P::TmaA x_in;          // GEMM1's A: x [t, H]
  typename P::TmaBHalf sw1_half;  // GEMM1's B: its gate | up [H, 2I] in half-height boxes
  typename P::TmaB sw2;           // GEMM2's B: its down [I, H]
  typename P::TmaC h1_out;        // GEMM1's pre-activations: h1 [R, 2I] (routed rows)
  typename P::TmaC hs_out;        // and hs [t, 2I] (the shared expert's, kept; else a copy of h1_out)
};

template <class Cfg, int kGemm>
struct MoeGemmHooks : MoeRowTileCtl<MoeBuilds<MoeCtl>, kGemm> {
  static constexpr bool kTileDone = true, kGroupedB = true;
  static constexpr bool kMapsRows = kGemm == 1, kStoreBoxes = kGemm == 1, kSplitB = kGemm == 1;
  static constexpr bool kSplitA = kGemm == 1, kBSource = kGemm == 2;  // the shared expert's x, and down
  static constexpr bool kKeepsPreact = kGemm == 1;                      // and its pre-activations
  using P = sm90::Params<Cfg>;
  using MoeRowTileCtl<MoeBuilds<MoeCtl>, kGemm>::b;
  using MoeRowTileCtl<MoeBuilds<MoeCtl>, kGemm>::expert;
  using MoeRowTileCtl<MoeBuilds<MoeCtl>, kGemm>::shared;
  const MoeFwdSm90Params<Cfg>* p;
  KOSMOS_DEVICE int b_kblock0(gemm::TileCoord t) const {
    return shared(t) ? 0 : expert(t) * ((kGemm == 1 ? p->m.H : p->m.I) / Cfg::kBK);
  }
  // GEMM1 of the shared expert: x's token rows (past t: zeros, computed and never read).
  KOSMOS_DEVICE const typename P::TmaA* a_source(gemm::TileCoord t, int* rows, int* tile_m) const {
    if (!shared(t)) return nullptr;
    *rows = b->s.tokens;
    *tile_m = t.m - b->s.shared_rb0;
    return &p->x_in;
  }
  KOSMOS_DEVICE const typename P::TmaB* b_source(gemm::TileCoord t) const { return shared(t) ? &p->sw2 : nullptr; }
  // GEMM1: gate columns [n * kBN/2, +kBN/2) beside the same up columns (I further on).
  KOSMOS_DEVICE const typename P::TmaBHalf* b_halves(gemm::TileCoord t, int* lo, int* hi) const {
    *lo = t.n;
    *hi = p->m.I / (Cfg::kBN / 2) + t.n;
    return shared(t) ? &p->sw1_half : &p->w1_half;
  }
  KOSMOS_DEVICE sm90::StoreBox<typename P::TmaC> store_box(gemm::TileCoord t) const {
    return {&p->act_out, p->m.rbs * Cfg::kBM, p->m.I, t.m, t.n * (Cfg::kBN / 2)};
  }
  // Where GEMM1's bf16 pre-activations go, kept for the backward: the tile's
  // gate half at column kBN / 2 * n of h1 (routed: arena rows) or hs (the
  // shared expert's: token rows, those past t clipped), its up half I further.
  // Nowhere (false) in a launch no backward reads: the tile leaves as h alone.
  KOSMOS_DEVICE bool preact_box(gemm::TileCoord t, sm90::StoreBox<typename P::TmaC>* gate,
                                sm90::StoreBox<typename P::TmaC>* up) const {
    if (p->m.h1 == nullptr) return false;
    const int col = t.n * (Cfg::kBN / 2), I = p->m.I;
    if (shared(t)) {
      *gate = {&p->hs_out, b->s.tokens, 2 * I, t.m - b->s.shared_rb0, col};
    } else {
      *gate = {&p->h1_out, b->s.shared_rb0 * Cfg::kBM, 2 * I, t.m, col};
    }
    *up = *gate;
    up->col0 += I;
    return true;
  }
  // Unreachable: the launcher requires N % 8 == 0, so every tile is staged and
  // leaves through store_box.
  template <class OutT>
  KOSMOS_DEVICE OutT* row_ptr(gemm::TileCoord, int) const {
    trap();
  }
};

template <class Cfg, bool kPeers>
struct MoeSm90Ops : MoeSm90LocalOps<kPeers> {
  const MoeFwdSm90Params<Cfg>& pp;
  sm90::SharedStorage<Cfg>& sm;
  MoePass* pass;

  template <int kGemm>
  KOSMOS_DEVICE void run_pass(MoeBuilds<MoeCtl>& b, int most) {
    using Hooks = MoeGemmHooks<Cfg, kGemm>;
    Hooks h{{&b}, &pp};
    MoePassSched<MoeBuilds<MoeCtl>> sched{&b, pass, kGemm, most};
    if constexpr (kGemm == 1) {
      sm90::TileEngine<Cfg, gemm::bf16, Hooks, SwigluStaging>::run(pp.g1, sm, sched, h);
    } else {
      sm90::TileEngine<Cfg, gemm::bf16, Hooks>::run(pp.g2, sm, sched, h);
    }
  }

  // Up to `most` tiles of the build queue (< 0: until it is empty), as passes.
  KOSMOS_DEVICE int build(const MoeLayout& L, int most) {
    MoeCtl one = this->ctl;
    MoeBuilds<MoeCtl> b{one, this->s(), L};
    if (threadIdx.x == 0) pass->pending.gemm = 0, pass->ran = 0;
    __syncthreads();
    for (;;) {
      if (threadIdx.x == 0 && pass->pending.gemm == 0 && (most < 0 || pass->ran < most)) b.next(&pass->pending);
      __syncthreads();
      const int gemm = pass->pending.gemm, ran = pass->ran;
      __syncthreads();  // read before thread 0 writes the pass again
      if (gemm == 0) return ran;
      const TraceSpan span;
      if (gemm == 1) run_pass<1>(b, most); else run_pass<2>(b, most);
      __syncthreads();  // the engine's threads return at different times
      if (threadIdx.x == 0) span.close(this->p().trace, this->ctl.cta, kTraceBuild, gemm);
    }
  }
};

// kPeers: launched at EP > 1 (the EP = 1 instantiation holds no peer code).
template <class Cfg, bool kPeers>
__global__ void __launch_bounds__(Cfg::kThreads, 1) moe_fwd_sm90_kernel(const __grid_constant__ MoeFwdSm90Params<Cfg> p) {
  static_assert(Cfg::kThreads == kMoeThreads && Cfg::kBM == kMoeTileRows, "the CTA and row block of moe/fwd_ops.cuh");
  static_assert(sizeof(sm90::SharedStorage<Cfg>::a) >= kMoeScratchInts * sizeof(int), "the front's scratch fits the A ring");
  static_assert(moe_fold_fits_rings<sm90::SharedStorage<Cfg>>(), "the fold's rows and rings fit the A and B rings");
  static_assert(sm90::SharedStorage<Cfg>::kLaunchBytes + sizeof(MoeLayout) + sm90::kSmemStaticReserve <= sm90::kSmemOptIn,
                "the engine's shared memory and the layout's copy fit the 227 KB");
  extern __shared__ char smem_raw[];
  __shared__ int bc;
  __shared__ MoePass pass;
  __shared__ MoeLayout layout_copy;
  auto& s = sm90::shared_storage<Cfg>(smem_raw);
  const MoeCtl ctl{&p.m, launch_epoch(&p.m.ctrl->epoch), (int)blockIdx.x};
  // The front's scratch is the engine's A ring: no engine runs during the front.
  MoeSm90Ops<Cfg, kPeers> ops{{{ctl, &bc, reinterpret_cast<int*>(s.a)}, &layout_copy}, p, s, &pass};
  moe_fwd_cta(ops, p.m.s, (int)blockIdx.x, (int)gridDim.x, p.m.movers, p.m.switching != 0);
}

// The problem's shape, or "" when this kernel runs it (the handler's checks name values).
inline const char* moe_fwd_sm90_unsupported(int H, int I, int E, int k) {
  if (H <= 0 || H % 64) return "hidden must be a positive multiple of 64 (GEMM1's k-blocks, GEMM2's 16-byte rows)";
  if (I <= 0 || I % 128) return "expert_intermediate must be a positive multiple of 128 (the SwiGLU column blocks)";
  return moe_cta_unsupported(H, E, k);
}

// Launches over m (its workspace zeroed where moe_ws_layout says) with `grid`
// CTAs; sw1 [H, 2I] and sw2 [I, H] are the shared expert's (m.s.shared_blocks > 0).
template <class Cfg>
cudaError_t moe_fwd_sm90_launch(const MoeFwdParams& m, const void* w1, const void* w2, const void* sw1,
                                const void* sw2, int grid, cudaStream_t stream) {
  using sm90::make_operand_tma;
  const int R = m.s.shared_rb0 * Cfg::kBM, RS = m.rbs * Cfg::kBM, H = m.H, I = m.I, E = m.s.e_local;
  const bool shared = m.s.shared_blocks > 0;
  const auto* pw1 = static_cast<const sm90::bf16*>(w1);
  const auto* pw2 = static_cast<const sm90::bf16*>(w2);
  const auto* psw1 = shared ? static_cast<const sm90::bf16*>(sw1) : pw1;
  const auto* psw2 = shared ? static_cast<const sm90::bf16*>(sw2) : pw2;
  const auto* x = reinterpret_cast<const sm90::bf16*>(m.x);
  const auto* arena = reinterpret_cast<const sm90::bf16*>(m.arena);
  const auto* act = reinterpret_cast<const sm90::bf16*>(m.act);
  // Without h1 (keep_preacts = 0: the workspace has no h1 region) a copy of the act
  // store's descriptor, never stored through (preact_box).
  const auto h1_out =
      m.h1 ? sm90::make_output_tma<Cfg>(m.h1, R, 2 * I, 2 * I) : sm90::make_output_tma<Cfg>(m.act, RS, I, I);
  MoeFwdSm90Params<Cfg> p{m,
                          {make_operand_tma<Cfg::kMajorA, typename Cfg::RingA>(arena, R, H, H),
                           make_operand_tma<Cfg::kMajorB, typename Cfg::RingB>(pw1, 2 * I, E * H, 2 * I),
                           {}, nullptr, R, 2 * I, H},
                          {make_operand_tma<Cfg::kMajorA, typename Cfg::RingA>(act, RS, I, I),
                           make_operand_tma<Cfg::kMajorB, typename Cfg::RingB>(pw2, H, E * I, H),
                           sm90::make_output_tma<Cfg>(m.y_rows, RS, H, H), m.y_rows, RS, H, I},
                          make_operand_tma<Cfg::kMajorB, typename Cfg::RingBHalf>(pw1, 2 * I, E * H, 2 * I),
                          sm90::make_output_tma<Cfg>(m.act, RS, I, I),
                          make_operand_tma<Cfg::kMajorA, typename Cfg::RingA>(x, m.s.tokens, H, H),
                          make_operand_tma<Cfg::kMajorB, typename Cfg::RingBHalf>(psw1, 2 * I, shared ? H : E * H, 2 * I),
                          make_operand_tma<Cfg::kMajorB, typename Cfg::RingB>(psw2, H, shared ? I : E * I, H),
                          h1_out,
                          m.hs ? sm90::make_output_tma<Cfg>(m.hs, m.s.tokens, 2 * I, 2 * I) : h1_out};
  constexpr int kSmem = sm90::SharedStorage<Cfg>::kLaunchBytes;
  if (m.s.ep > 1) moe_fwd_sm90_kernel<Cfg, true><<<grid, Cfg::kThreads, kSmem, stream>>>(p);
  else moe_fwd_sm90_kernel<Cfg, false><<<grid, Cfg::kThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kosmos::moe
