// The MoE backward megakernel with Hopper builders (sm_90a; paper §3.3.2):
// the forward's CTA life (moe_fwd_cta, moe/fwd_sched.h) over the
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
// The forward's workspace supplies act, h1 and at EP = 1 x_rows (moe/fwd_ws.h; their
// padding rows are zeros, as the dY arena's, so whole row blocks contract).
//
// The shared expert's row blocks follow the arena's, as in the forward: its
// dgrad2 tiles read dY itself and its pre-activations hs, its dgrad1 tiles
// its own gate | up, its wgrad tiles dY's and x's token rows against its
// arena rows of act and dh1 (k_range's two starts), and the fold adds its dX
// row with weight 1. Its dW leave through their own store boxes (dsw1, dsw2).
//
// At EP > 1 the arena (dY rows) and wgrad1's X rows are the heap's, pushed by
// every source (moe/fwd_heap.h), and the dX rows return as the forward's units.
// Not here: the router and routing-weight gradients (XLA). The portable
// builders of the same schedule: moe/bwd_portable.cuh.
#pragma once
#include "gemm/sm90/tile_engine.cuh"
#include "moe/bwd_hooks_sm90.cuh"
#include "moe/bwd_queues.h"
#include "moe/fwd_ops.cuh"
#include "moe/sm90_ops.cuh"
#include "moe/swiglu_bwd_sm90.cuh"

namespace kosmos::moe {

template <class Dg, class Wg, bool kPeers>
struct MoeBwdSm90Ops : MoeSm90LocalOps<kPeers> {
  static_assert(sizeof(sm90::SharedStorage<Dg>) == sizeof(sm90::SharedStorage<Wg>),
                "the two layouts' engines share one CTA's shared memory");
  const MoeBwdSm90Params<Dg, Wg>& pp;
  char* smem;  // the kernel's dynamic shared memory (unaligned: shared_storage aligns it)
  MoePass* pass;

  template <int kKind>
  KOSMOS_DEVICE void run_pass(MoeBwdBuilds<MoeCtl>& b, int most) {
    MoePassSched<MoeBwdBuilds<MoeCtl>> sched{&b, pass, kKind, most};
    if constexpr (kKind <= 2) {
      using Hooks = MoeBwdDgradHooks<Dg, Wg, kKind>;
      Hooks h{{&b}, &pp};
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
    MoeCtl one = this->ctl;
    MoeBwdBuilds<MoeCtl> b{one, this->s(), L, pp.w};
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
      if (threadIdx.x == 0) span.close(this->p().trace, this->ctl.cta, kTraceBuild, kind);
    }
  }
};

// kPeers: launched at EP > 1 (the EP = 1 instantiation holds no peer code).
template <class Dg, class Wg, bool kPeers>
__global__ void __launch_bounds__(Dg::kThreads, 1) moe_bwd_sm90_kernel(const __grid_constant__ MoeBwdSm90Params<Dg, Wg> p) {
  static_assert(Dg::kThreads == kMoeThreads && Dg::kBM == kMoeTileRows && Wg::kBM == kMoeTileRows,
                "the CTA and row block of moe/fwd_ops.cuh");
  static_assert(sizeof(sm90::SharedStorage<Dg>::a) >= kMoeScratchInts * sizeof(int), "the front's scratch fits the A ring");
  static_assert(moe_fold_fits_rings<sm90::SharedStorage<Dg>>(), "the fold's rows and rings fit the A and B rings");
  static_assert(sm90::SharedStorage<Dg>::kLaunchBytes + sizeof(MoeLayout) + sm90::kSmemStaticReserve <= sm90::kSmemOptIn,
                "the engine's shared memory and the layout's copy fit the 227 KB");
  extern __shared__ char smem_raw[];
  __shared__ int bc;
  __shared__ MoePass pass;
  __shared__ MoeLayout layout_copy;
  auto& s = sm90::shared_storage<Dg>(smem_raw);
  const MoeCtl ctl{&p.m, launch_epoch(&p.m.ctrl->epoch), (int)blockIdx.x, "moe_backward"};
  // The front's scratch is the engines' A ring: no engine runs during the front.
  MoeBwdSm90Ops<Dg, Wg, kPeers> ops{{{ctl, &bc, reinterpret_cast<int*>(s.a)}, &layout_copy}, p, smem_raw, &pass};
  moe_fwd_cta(ops, p.m.s, (int)blockIdx.x, (int)gridDim.x, p.m.movers, p.m.switching != 0);
}

// The problem's shape, or "" when this kernel runs it (the handler names values).
inline const char* moe_bwd_sm90_unsupported(int H, int I, int E, int k) {
  if (H <= 0 || H % 128) return "hidden must be a positive multiple of 128 (wgrad1's tile rows of dW1)";
  if (I <= 0 || I % 128) return "expert_intermediate must be a positive multiple of 128 (wgrad2's tile rows of dW2)";
  return moe_cta_unsupported(H, E, k);
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
  constexpr int kSmem = sm90::SharedStorage<Dg>::kLaunchBytes;
  if (m.s.ep > 1) moe_bwd_sm90_kernel<Dg, Wg, true><<<grid, Dg::kThreads, kSmem, stream>>>(p);
  else moe_bwd_sm90_kernel<Dg, Wg, false><<<grid, Dg::kThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kosmos::moe
