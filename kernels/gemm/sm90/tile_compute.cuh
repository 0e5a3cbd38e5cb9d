// Hopper tile engine (gemm/sm90/tile_engine.cuh): the consumer warp groups'
// work on one claimed tile: the WGMMA mainloop over the ring's stages, then
// the epilogue (gemm/sm90/epilogue.cuh), staged through shared memory and
// stored by TMA under the next tile's mainloop where the op allows, and the
// finished tile handed to the publisher (gemm/sm90/publisher.cuh).
#pragma once
#include "gemm/sm90/barrier.cuh"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/publisher.cuh"
#include "gemm/sm90/staging.cuh"
#include "gemm/sm90/tile_config.cuh"
#include "gemm/sm90/tile_loads.cuh"
#include "gemm/tile_hooks.h"

namespace kosmos::sm90 {

template <class Cfg, class OutT, class Hooks, template <class, class, bool, class> class Staging>
struct TileCompute {
  using P = Params<Cfg>;
  using S = SharedStorage<Cfg>;
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using Loads = TileLoads<Cfg, Hooks>;
  static constexpr int kStages = Cfg::kStages;
  static constexpr uint32_t kConsumerThreads = 128 * Cfg::kConsumerWGs;
  // The staged tile leaves by TMA store (swizzled boxes, one thread issues them)
  // unless the hooks map rows one by one (epilogue.cuh).
  static constexpr bool kBoxes = Cfg::kSmemEpilogue && (!Hooks::kMapsRows || gemm::store_boxes_v<Hooks>);
  using Stage = Staging<Cfg, OutT, kBoxes, Hooks>;
  using Pub = Publisher<Cfg, Hooks>;

  // Consumers: acc = sum over the tile's kblocks k-blocks of A_tile . B_tile^T
  // (none: zeros), keeping one wgmma batch in flight so the tensor cores never
  // wait for the release handshake. at_k(k, kblocks) runs on every consumer
  // thread once k-block k's batch is in flight and k - 1's stage released
  // (Staging::in_mainloop).
  template <class Thr, class Acc, class AtK>
  static CUTE_DEVICE void mainloop(S& s, Ring& ring, int kblocks, const Thr& thr, Acc& acc, const AtK& at_k) {
    // A stage may be overwritten once every consumer warp's wgmmas that read it have completed.
    auto release = [&](int slot) {
      if (threadIdx.x % 32 == 0) mbar_arrive(&s.empty[slot]);
    };
    typename Cfg::TiledMma mma;
    Tensor sA = make_tensor(make_smem_ptr(s.sa()), typename Cfg::RingA{});
    Tensor sB = make_tensor(make_smem_ptr(s.sb()), typename Cfg::RingB{});
    Tensor fA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, MMA_M, MMA_K, stage) descriptors
    Tensor fB = thr.make_fragment_B(thr.partition_B(sB));
    mma.accumulate_ = GMMA::ScaleOut::Zero;  // the first wgmma overwrites: no separate clear
    if (kblocks == 0) clear(acc);           // unless there is none
    int prev = -1;
    for (int k = 0; k < kblocks; ++k) {
      mbar_wait(&s.full[ring.slot], ring.phase, "stage full");
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(fA); ++kb) {
        cute::gemm(mma, fA(_, _, kb, ring.slot), fB(_, _, kb, ring.slot), acc);
        mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<1>();  // the previous k-block's batch is done: free its stage
      warpgroup_fence_operand(acc);
      if (prev >= 0) release(prev);
      at_k(k, kblocks);
      prev = ring.slot;
      ring.advance(kStages);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    if (prev >= 0) release(prev);
  }

  // Consumer thread 0: the staged tile t's TMA stores (Stage::kOutCols columns), in its bulk group.
  static CUTE_DEVICE void store_staged(const P& p, S& s, gemm::TileCoord t, Hooks& h) {
    if constexpr (Hooks::kMapsRows) {
      store_boxes<Cfg, Stage::kOutCols>(s, h.store_box(t));
    } else {
      static_assert(Stage::kOutCols == Cfg::kBN, "a narrowed tile goes where the hooks say (store_box)");
      store_boxes<Cfg>(s, StoreBox<typename P::TmaC>{&p.tma_c, p.M, p.N, t.m, t.n * Cfg::kBN});
    }
  }

  // A tile whose rows are still being copied out of the staged buffer.
  struct InFlight {
    gemm::TileCoord t{0, 0};
    bool valid = false;
  };

  // Consumers, before the staged buffer is written again (or at exit): the
  // copies of the tile in flight have read it and, where the hooks publish
  // tiles (or at exit), have written global memory; then that tile goes to the
  // publisher. Publishing one tile late lets the copies overlap the next
  // tile's mainloop instead of stalling the tensor cores for their writes.
  template <bool kExit>
  static CUTE_DEVICE void retire(S& s, InFlight& f, int ctid) {
    if constexpr (Hooks::kTileDone || kExit) {
      bulk_wait_writes();
    } else {
      bulk_wait_reads();
    }
    named_barrier(kConsumerBarrier, kConsumerThreads);
    if constexpr (Hooks::kTileDone) {
      if (ctid == 0 && f.valid) Pub::post(s, f.t, true);
    }
    f.valid = false;
  }

  // Consumers: compute output tile t and store it (see epilogue.cuh). ctid is
  // the thread's index among the consumer threads.
  static CUTE_DEVICE void consume_tile(const P& p, S& s, Ring& ring, gemm::TileCoord t, Hooks& h, int ctid,
                                       InFlight& f, Stage& stage) {
    typename Cfg::TiledMma mma;
    auto thr = mma.get_thread_slice(ctid);
    Tensor acc = partition_fragment_C(mma, Shape<BM, BN>{});
    auto phase = [&](gemm::TilePhase ph) {  // trace builds only (gemm/tile_hooks.h tile_phase)
      if constexpr (gemm::traces_tiles_v<Hooks>) {
        if (ctid == 0) h.tile_phase(t, ph);
      }
    };
    phase(gemm::TilePhase::kClaimed);
    int a_k0 = 0, b_k0 = 0;
    const int kblocks = Loads::k_blocks(p, t, h, &a_k0, &b_k0);
    mainloop(s, ring, kblocks, thr, acc, stage.in_mainloop(p, s, t, h, ctid));
    phase(gemm::TilePhase::kComputed);
    if constexpr (Cfg::kSmemEpilogue) {
      if (smem_epilogue(p)) {
        retire<false>(s, f, ctid);
        stage.stage(p, s, t, h, ctid, thr, acc, phase);
        smem_to_async_proxy_fence();
        named_barrier(kConsumerBarrier, kConsumerThreads);  // the whole tile is staged
        if constexpr (kBoxes) {
          if (ctid == 0) {
            store_staged(p, s, t, h);
            bulk_commit();
          }
        } else if (ctid < Cfg::kBM) {
          copy_out_row<Cfg, OutT>(p, s, h, t, ctid);
          bulk_commit();
        }
        phase(gemm::TilePhase::kIssued);
        f.t = t, f.valid = true;
        return;
      }
    }
    stage.unstaged(h, t);
    store_tile<Cfg, OutT>(p, thr, acc, t, h);
    phase(gemm::TilePhase::kIssued);
    if constexpr (Hooks::kTileDone) {
      named_barrier(kConsumerBarrier, kConsumerThreads);  // every store of the tile issued
      if (ctid == 0) h.tile_done(t);
    }
  }
};

}  // namespace kosmos::sm90
