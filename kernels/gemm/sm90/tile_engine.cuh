// Hopper tile engine: the schedule. One CTA = one producer warp group (a
// single thread issues TMA) + two consumer warp groups (WGMMA), joined by a
// ring of shared-memory stages guarded by mbarriers.
//
// Interface for persistent kernels: every thread of the CTA calls
// run(params, smem, scheduler, hooks). The producer thread claims tiles from
// the scheduler and broadcasts each claim through a 2-slot shared-memory
// mailbox; consumers compute "output tile (m, n) of this problem" for every
// claim they receive. The producer runs ahead into the next tile while the
// consumers finish and store the current one, and with the staged epilogue the
// stored tile's copies run under the next tile's mainloop. Hooks:
// gemm/tile_hooks.h; how a tile enters the staged buffer: Staging
// (gemm/sm90/staging.cuh; PlainStaging unless an op brings its own).
#pragma once
#include "gemm/sm90/barrier.cuh"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/publisher.cuh"
#include "gemm/sm90/staging.cuh"
#include "gemm/sm90/tile_config.cuh"
#include "gemm/tile_hooks.h"

namespace kosmos::sm90 {

template <class Cfg, class OutT, class Hooks, template <class, class, bool, class> class Staging = PlainStaging>
struct TileEngine {
  using P = Params<Cfg>;
  using S = SharedStorage<Cfg>;
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using BK = typename Cfg::BK;
  static constexpr int kStages = Cfg::kStages;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128*40 + 256*232 <= 64K
  static constexpr int kEvenRegs = 65536 / Cfg::kThreads / 8 * 8;  // 168 for 384 threads
  static constexpr uint32_t kConsumerThreads = 128 * Cfg::kConsumerWGs;
  // The staged tile leaves by TMA store (swizzled boxes, one thread issues them)
  // unless the hooks map rows one by one (epilogue.cuh).
  static constexpr bool kBoxes = Cfg::kSmemEpilogue && (!Hooks::kMapsRows || gemm::store_boxes_v<Hooks>);
  using Stage = Staging<Cfg, OutT, kBoxes, Hooks>;
  using Pub = Publisher<Cfg, Hooks>;

  // One thread: barrier counts, then make them visible to TMA and all threads.
  static CUTE_DEVICE void init(const P& p, S& s) {
    if (threadIdx.x == 0) {
      for (int i = 0; i < kStages; ++i) {
        mbar_init(&s.full[i], 1);                      // the producer's arrive_expect_tx
        mbar_init(&s.empty[i], Cfg::kConsumerWarps);  // every consumer warp done reading
      }
      for (int i = 0; i < 2; ++i) {
        mbar_init(&s.claim_full[i], 1);
        mbar_init(&s.claim_empty[i], Cfg::kConsumerWarps);
        mbar_init(&s.done_full[i], 1);   // consumer thread 0's post
        mbar_init(&s.done_empty[i], 1);  // the publisher's read
      }
      Stage::init(s);
      s.done_posts = 0;
      mbar_init_fence();
      prefetch_tma_descriptor(p.tma_a.get_tma_descriptor());
      prefetch_tma_descriptor(p.tma_b.get_tma_descriptor());
    }
    __syncthreads();
  }

  // The k-blocks tile t contracts, return of them from A's *a_kb0 and B's
  // *b_kb0: all of K, or the hooks' range (kKRange: a grouped weight
  // gradient's expert rows).
  static CUTE_DEVICE int k_blocks(const P& p, gemm::TileCoord t, Hooks& h, int* a_kb0, int* b_kb0) {
    *a_kb0 = *b_kb0 = 0;
    int kblocks = gemm::ceil_div(p.K, Cfg::kBK);
    if constexpr (gemm::ranges_k_v<Hooks>) h.k_range(t, a_kb0, b_kb0, &kblocks);
    return kblocks;
  }

  // B as the (N, K) coordinate tensor TMA reads, from row b_row0 (kRowsB: the
  // first row of tile t's operand in a stack of them along n).
  static CUTE_DEVICE auto b_rows(const P& p, const typename P::TmaB& tma_b, gemm::TileCoord t, Hooks& h) {
    if constexpr (gemm::rows_b_v<Hooks>) {
      return domain_offset(make_coord(h.b_row0(t), 0), tma_b.get_tma_tensor(make_shape(p.N, p.K)));
    } else {
      return tma_b.get_tma_tensor(make_shape(p.N, p.K));
    }
  }

  // Producer thread: stream tile t's k-blocks of A and B into the ring. Hooks may
  // name another A (kSplitA a_source: [a_rows, K] in parameter space, at tile row
  // a_tile_m), another B (kBSource b_source), B's first k-block (kGroupedB) or
  // row (kRowsB), B's two half-blocks (kSplitB), or the k-blocks to contract
  // (kKRange); one load loop: 40 registers.
  static CUTE_DEVICE void produce_tile(const P& p, S& s, Ring& ring, gemm::TileCoord t, Hooks& h) {
    const typename P::TmaA* a = &p.tma_a;
    int a_rows = p.M, a_tile_m = t.m;
    if constexpr (gemm::split_a_v<Hooks>) {
      int r = 0, m = 0;
      if (const typename P::TmaA* other = h.a_source(t, &r, &m)) a = other, a_rows = r, a_tile_m = m;
    }
    const typename P::TmaB* b = &p.tma_b;
    if constexpr (gemm::sources_b_v<Hooks>) {
      if (const typename P::TmaB* other = h.b_source(t)) b = other;
    }
    int b_kb0 = 0, b_lo = 0, b_hi = 0;
    if constexpr (gemm::groups_b_v<Hooks>) b_kb0 = h.b_kblock0(t);
    const typename P::TmaBHalf* b_half = nullptr;
    if constexpr (gemm::splits_b_v<Hooks>) b_half = h.b_halves(t, &b_lo, &b_hi);
    const typename P::TmaA& tma_a = *a;
    const typename P::TmaB& tma_b = *b;
    Tensor gA =
        local_tile(tma_a.get_tma_tensor(make_shape(a_rows, p.K)), make_shape(BM{}, BK{}), make_coord(a_tile_m, _));
    Tensor gB = local_tile(b_rows(p, tma_b, t, h), make_shape(BN{}, BK{}), make_coord(t.n, _));
    Tensor sA = make_tensor(make_smem_ptr(s.sa()), typename Cfg::RingA{});
    Tensor sB = make_tensor(make_smem_ptr(s.sb()), typename Cfg::RingB{});
    // (TMA, k-block) sources and (TMA, stage) destinations.
    auto [tAg, tAs] = tma_partition(tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
    auto [tBg, tBs] = tma_partition(tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB), group_modes<0, 2>(gB));
    h.before_tile(t);
    int a_k0 = 0, b_k0 = 0;
    const int kblocks = k_blocks(p, t, h, &a_k0, &b_k0);
    b_k0 += b_kb0;
    for (int k = 0; k < kblocks; ++k) {
      h.before_k(t, (a_k0 + k) * Cfg::kBK);
      mbar_wait(&s.empty[ring.slot], ring.phase ^ 1, "stage empty");
      mbar_arrive_expect_tx(&s.full[ring.slot], Cfg::kStageBytes);
      copy(tma_a.with(s.full[ring.slot]), tAg(_, a_k0 + k), tAs(_, ring.slot));
      if constexpr (gemm::splits_b_v<Hooks>) {
        load_b_halves(*b_half, p, s, ring.slot, b_lo, b_hi, b_k0 + k);
      } else {
        copy(tma_b.with(s.full[ring.slot]), tBg(_, b_k0 + k), tBs(_, ring.slot));
      }
      ring.advance(kStages);
    }
  }

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
    const int kblocks = k_blocks(p, t, h, &a_k0, &b_k0);
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

  // Producer thread: claim, broadcast, load; a final invalid claim ends the CTA.
  // The claim of the following tile is made before this tile's loads stream, so
  // a dynamic queue's atomic round trip overlaps the ring instead of stalling
  // it (a static schedule answers at once either way).
  template <class Sched>
  static CUTE_DEVICE void produce_all(const P& p, S& s, Sched& sched, Hooks& h) {
    Ring stages, mailbox;
    Stage stage;
    gemm::TileCoord next{0, 0};
    bool next_ok = sched.next(next);
    for (;;) {
      const gemm::TileCoord t = next;
      const bool ok = next_ok;
      mbar_wait(&s.claim_empty[mailbox.slot], mailbox.phase ^ 1, "claim slot empty");
      s.claim[mailbox.slot] = t;
      s.claim_valid[mailbox.slot] = ok;
      mbar_arrive(&s.claim_full[mailbox.slot]);  // release: the slot's stores travel with it
      if (!ok) return;
      next_ok = sched.next(next);
      produce_tile(p, s, stages, t, h);
      stage.after_loads(p, s, t, h);
      mailbox.advance(2);
    }
  }

  static CUTE_DEVICE void consume_all(const P& p, S& s, Hooks& h, int ctid) {
    Ring stages, mailbox;
    InFlight inflight;
    Stage stage;
    for (;;) {
      mbar_wait(&s.claim_full[mailbox.slot], mailbox.phase, "claim slot full");
      // Lane 0 alone reads the slot, frees it and shuffles the claim to its
      // warp, so the slot's readers are exactly the threads whose arrives the
      // producer waits for (every lane reading it, ordered by __syncwarp, is
      // enough under PTX but racecheck reported it, 2026-12-01).
      int claim[3] = {0, 0, 0};
      if (threadIdx.x % 32 == 0) {
        claim[0] = s.claim[mailbox.slot].m, claim[1] = s.claim[mailbox.slot].n, claim[2] = s.claim_valid[mailbox.slot];
        mbar_arrive(&s.claim_empty[mailbox.slot]);
      }
      const gemm::TileCoord t{__shfl_sync(0xffffffffu, claim[0], 0), __shfl_sync(0xffffffffu, claim[1], 0)};
      const bool ok = __shfl_sync(0xffffffffu, claim[2], 0) != 0;
      if (!ok) break;
      consume_tile(p, s, stages, t, h, ctid, inflight, stage);
      mailbox.advance(2);
    }
    // The staged buffer is shared memory a fused kernel may reuse after the
    // engine, and the last tile's tile_done is still due.
    if (smem_epilogue(p)) retire<true>(s, inflight, ctid);
    if constexpr (Hooks::kTileDone) {
      if (ctid == 0) Pub::post(s, gemm::TileCoord{0, 0}, false);
    }
  }

  // Entry point for every thread of a CTA of Cfg::kThreads threads. Returns with
  // every warp back at the kernel's even register share (kEvenRegs), so code a
  // fused kernel runs after the engine (reducers, finish) is not squeezed into
  // the producer's kProducerRegs: ptxas compiles code after a setmaxnreg.dec
  // under that limit, and code both warp groups share under the smaller one.
  //
  // The producer warp group takes its registers back only after the consumers
  // have returned theirs, and waits for that at a named barrier: setmaxnreg.inc
  // on an exhausted pool retries in a loop, and four warps spinning there for a
  // whole launch took ~18% of the issue slots the consumers' epilogue needed
  // (ncu, 2026-11-30).
  template <class Sched>
  static CUTE_DEVICE void run(const P& p, S& s, Sched& sched, Hooks& h) {
    init(p, s);
    if (threadIdx.x < 128) {
      regs_dealloc<kProducerRegs>();
      if (threadIdx.x == 0) produce_all(p, s, sched, h);
      if constexpr (Hooks::kTileDone) {
        if (threadIdx.x == Pub::kThread) Pub::publish_all(s, h);
      }
      __syncwarp();  // setmaxnreg is warp-aligned: lane 0 rejoins first
      named_barrier(kRegsBackBarrier, Cfg::kThreads);
      regs_alloc<kEvenRegs>();
    } else {
      regs_alloc<kConsumerRegs>();
      consume_all(p, s, h, threadIdx.x - 128);
      regs_dealloc<kEvenRegs>();
      named_barrier_arrive(kRegsBackBarrier, Cfg::kThreads);
    }
  }
};

}  // namespace kosmos::sm90
