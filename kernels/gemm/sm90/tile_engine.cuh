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
// gemm/tile_hooks.h.
#pragma once
#include "gemm/sm90/barrier.cuh"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/tile_config.cuh"
#include "gemm/tile_hooks.h"

namespace kosmos::sm90 {

// Position in a ring of n slots and the phase parity of the slot's barrier.
struct Ring {
  int slot = 0;
  uint32_t phase = 0;
  CUTE_DEVICE void advance(int n) {
    if (++slot == n) slot = 0, phase ^= 1;
  }
};

template <class Cfg, class OutT, class Hooks>
struct TileEngine {
  using P = Params<Cfg>;
  using S = SharedStorage<Cfg>;
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using BK = typename Cfg::BK;
  static constexpr int kStages = Cfg::kStages;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128*40 + 256*232 <= 64K
  static constexpr int kEvenRegs = 65536 / Cfg::kThreads / 8 * 8;  // 168 for 384 threads
  static constexpr uint32_t kConsumerBarrier = 1;                // named barrier ids
  static constexpr uint32_t kRegsBackBarrier = 2;

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
      if constexpr (kPrefetch) {
        mbar_init(&s.c_free, 1);   // consumer thread 0: the previous tile's stores have read s.c
        mbar_init(&s.c_ready, 1);  // the producer's offer: its arrive (with the term's bytes, if it loads one)
        s.c_offers = 0;
      }
      s.done_posts = 0;
      mbar_init_fence();
      prefetch_tma_descriptor(p.tma_a.get_tma_descriptor());
      prefetch_tma_descriptor(p.tma_b.get_tma_descriptor());
    }
    __syncthreads();
  }

  // Producer thread: stream tile t's k-blocks of A and B into the ring. Hooks
  // with kSplitA may name another A for the tile (gemm/tile_hooks.h a_source).
  static CUTE_DEVICE void produce_tile(const P& p, S& s, Ring& ring, gemm::TileCoord t, Hooks& h) {
    const typename P::TmaA* a = &p.tma_a;
    int rows = p.M, tile_m = t.m;
    if constexpr (gemm::split_a_v<Hooks>) {  // one copy of the load loop: the producer has 40 registers
      int r = 0, m = 0;
      if (const typename P::TmaA* other = h.a_source(t, &r, &m)) a = other, rows = r, tile_m = m;
    }
    produce_from(p, *a, rows, tile_m, s, ring, t, h);
  }

  // produce_tile with A read through `tma_a` (an [a_rows, K] matrix in parameter
  // space, as TMA needs), at its tile row a_tile_m.
  static CUTE_DEVICE void produce_from(const P& p, const typename P::TmaA& tma_a, int a_rows, int a_tile_m, S& s,
                                       Ring& ring, gemm::TileCoord t, Hooks& h) {
    Tensor gA = local_tile(tma_a.get_tma_tensor(make_shape(a_rows, p.K)), make_shape(BM{}, BK{}), make_coord(a_tile_m, _));
    Tensor gB = local_tile(p.tma_b.get_tma_tensor(make_shape(p.N, p.K)), make_shape(BN{}, BK{}), make_coord(t.n, _));
    Tensor sA = make_tensor(make_smem_ptr(s.sa()), typename Cfg::RingA{});
    Tensor sB = make_tensor(make_smem_ptr(s.sb()), typename Cfg::RingB{});
    // (TMA, k-block) sources and (TMA, stage) destinations.
    auto [tAg, tAs] = tma_partition(tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
    auto [tBg, tBs] = tma_partition(p.tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB), group_modes<0, 2>(gB));
    h.before_tile(t);
    const int kblocks = gemm::ceil_div(p.K, Cfg::kBK);
    for (int k = 0; k < kblocks; ++k) {
      h.before_k(t, k * Cfg::kBK);
      mbar_wait(&s.empty[ring.slot], ring.phase ^ 1, "stage empty");
      mbar_arrive_expect_tx(&s.full[ring.slot], Cfg::kStageBytes);
      copy(tma_a.with(s.full[ring.slot]), tAg(_, k), tAs(_, ring.slot));
      copy(p.tma_b.with(s.full[ring.slot]), tBg(_, k), tBs(_, ring.slot));
      ring.advance(kStages);
    }
  }

  // Consumer warp: stage `slot` may be overwritten once this warp's wgmmas
  // that read it have completed.
  static CUTE_DEVICE void release(S& s, int slot) {
    if (threadIdx.x % 32 != 0) return;
    mbar_arrive(&s.empty[slot]);
  }

  // Consumers: acc = sum over k-blocks of A_tile . B_tile^T, keeping one wgmma
  // batch in flight so the tensor cores never wait for the release handshake.
  // at_k(k, kblocks) runs on every consumer thread once k-block k's batch is
  // in flight and k - 1's stage released (a place for one thread's short side
  // work: the tensor cores have a batch to chew on).
  template <class Thr, class Acc, class AtK>
  static CUTE_DEVICE void mainloop(const P& p, S& s, Ring& ring, const Thr& thr, Acc& acc, const AtK& at_k) {
    typename Cfg::TiledMma mma;
    Tensor sA = make_tensor(make_smem_ptr(s.sa()), typename Cfg::RingA{});
    Tensor sB = make_tensor(make_smem_ptr(s.sb()), typename Cfg::RingB{});
    Tensor fA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, MMA_M, MMA_K, stage) descriptors
    Tensor fB = thr.make_fragment_B(thr.partition_B(sB));
    mma.accumulate_ = GMMA::ScaleOut::Zero;  // the first wgmma overwrites: no separate clear
    const int kblocks = gemm::ceil_div(p.K, Cfg::kBK);
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
      if (prev >= 0) release(s, prev);
      at_k(k, kblocks);
      prev = ring.slot;
      ring.advance(kStages);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    if (prev >= 0) release(s, prev);
  }

  static constexpr uint32_t kConsumerThreads = 128 * Cfg::kConsumerWGs;
  // The staged tile leaves by TMA store (swizzled boxes, one thread issues them)
  // unless the hooks map rows one by one (epilogue.cuh).
  static constexpr bool kBoxes = Cfg::kSmemEpilogue && (!Hooks::kMapsRows || gemm::store_boxes_v<Hooks>);

  // Consumer thread 0: the staged tile t's TMA stores, in its bulk group.
  static CUTE_DEVICE void store_staged(const P& p, S& s, gemm::TileCoord t, Hooks& h) {
    if constexpr (Hooks::kMapsRows) {
      store_boxes<Cfg>(s, h.store_box(t));
    } else {
      store_boxes<Cfg>(s, StoreBox<typename P::TmaC>{&p.tma_c, p.M, p.N, t.m, t.n * Cfg::kBN});
    }
  }

  // A tile whose rows are still being copied out of the staged buffer, and
  // the parity of the next c_ready phase (kPrefetch).
  struct InFlight {
    gemm::TileCoord t{0, 0};
    bool valid = false;
    uint32_t c_phase = 0;
  };

  // Hooks that publish tiles (kTileDone) do it from a thread of their own,
  // lane 0 of producer warp 1, handed each retired tile through a 2-slot
  // mailbox. tile_done's release fence and its round-trip atomic then run
  // beside the consumers' next staging and mainloop: on consumer thread 0 they
  // held its warp group (so the tensor cores) ~1 us a tile (trace spans,
  // GEMM+RS loopback, 2026-12-01). The publisher waits on nothing but posts, so
  // a posted tile is published whatever the consumers wait on next.
  // It naps between polls (barrier.cuh mbar_wait): a publish a fraction of a
  // microsecond late costs nothing (the fold reads a band a step after its
  // claims), but a spinning warp takes issue slots from a consumer warp.
  static constexpr int kPublisherThread = 32;
  static constexpr uint32_t kPublisherNapNs = 256;

  static CUTE_DEVICE void publish_all(S& s, Hooks& h) {
    Ring box;
    for (;;) {
      mbar_wait(&s.done_full[box.slot], box.phase, "retired tile posted", kPublisherNapNs);
      const gemm::TileCoord t = s.done[box.slot];
      const bool ok = s.done_valid[box.slot] != 0;
      mbar_arrive(&s.done_empty[box.slot]);
      if (!ok) return;
      h.tile_done(t);
      box.advance(2);
    }
  }

  // Consumer thread 0: tile t (or, !valid, the end) to the publisher. The
  // arrive releases at CTA scope what this thread has observed (the tile's
  // completed copies, and through the consumers' barrier every other
  // thread's), and tile_done's own release carries it on to the GPU or system.
  static CUTE_DEVICE void post_done(S& s, gemm::TileCoord t, bool valid) {
    const uint32_t n = s.done_posts, slot = n & 1u, phase = (n >> 1) & 1u;
    mbar_wait(&s.done_empty[slot], phase ^ 1, "publisher slot free");
    s.done[slot] = t;
    s.done_valid[slot] = valid;
    s.done_posts = n + 1;
    mbar_arrive(&s.done_full[slot]);
  }

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
      if (ctid == 0 && f.valid) post_done(s, f.t, true);
    }
    f.valid = false;
  }

  // Consumers, tile t staged in s.c (kCombines hooks: gemm/tile_hooks.h): the
  // wait comes after the mainloop (and after retire, which has posted the
  // previous tile to the publisher, so no tile_done waits behind it:
  // tp/rs_sched.h, fold), and the barrier hands thread 0's acquire
  // to every consumer and orders every consumer's staging before the pass,
  // which rewrites s.c in place (epilogue.cuh combine_tile).
  static CUTE_DEVICE void combine(Hooks& h, S& s, gemm::TileCoord t, int ctid) {
    if (!h.combines(t)) return;
    if (ctid == 0) h.before_combine(t);
    named_barrier(kConsumerBarrier, kConsumerThreads);
    auto src = [&](int term) { return h.combine_src(t, term); };
    combine_tile<Cfg, kBoxes>(s, ctid, h.combine_terms(t), h.combine_own(t), src);
  }

  // Two-term combines (kPrefetchCombine hooks) load their other term into s.c
  // under the mainloop instead of reading it from global memory after it: the
  // 64 KB of loads the combine waited for after the mainloop (~3.5 us a
  // 128x256 tile, most of a K = 512 mainloop: trace spans, loopback GEMM+RS,
  // 2026-12-01) then land while the tensor cores still work, and the sum rides
  // on the staging (stage_tile kAddStaged).
  //
  // Per such tile, strictly alternating: consumer thread 0, which alone can
  // wait for the previous tile's stores (its bulk group), frees s.c early in
  // the mainloop (c_free); the producer, once it has issued the tile's last
  // loads, polls the term's readiness once (never waits: the tile's fallback
  // is the combine after the mainloop, whose wait is the one the schedule is
  // built around) and offers on c_ready, loading the term or not (c_loaded);
  // the consumers wait for the offer after the mainloop. The first version
  // polled from consumer thread 0 in the mainloop: its stalls there held a
  // quarter of a tensor-core warp group and the combining tiles' mainloops
  // grew 1-3 us (loopback trace spans, 2026-12-01).
  static constexpr bool kPrefetch = kBoxes && gemm::combines_v<Hooks> && gemm::prefetches_combine_v<Hooks>;
  static constexpr uint32_t kTileBytes = Cfg::kBN / Cfg::kOutBoxCols * Cfg::kOutBoxBytes;  // load_boxes' boxes

  static CUTE_DEVICE bool prefetches(const P& p, Hooks& h, gemm::TileCoord t) {
    if constexpr (kPrefetch) {
      return p.K > 0 && h.combines(t) && h.combine_terms(t) == 2;  // K > 0: the consumers' mainloop frees s.c
    } else {
      return false;
    }
  }

  // Consumer thread 0, at k-block `k` of a prefetching tile's mainloop: the
  // k-block where it frees s.c (two in: by then the previous tile's stores,
  // issued just before the mainloop, have usually read it).
  static CUTE_DEVICE bool frees_at(int k, int kblocks) { return k == (kblocks < 3 ? kblocks - 1 : 2); }

  // The producer thread, after tile t's loads: the offer (see kPrefetch).
  static CUTE_DEVICE void offer_prefetch(S& s, gemm::TileCoord t, Hooks& h) {
    if constexpr (kPrefetch) {
      const uint32_t n = s.c_offers;
      mbar_wait(&s.c_free, n & 1u, "staged buffer free for a prefetch");
      const bool go = h.try_before_combine(t);
      s.c_loaded = go;
      if (go) {
        gemm::async_proxy_fence();  // the acquire covers TMA's reads of the term
        mbar_arrive_expect_tx(&s.c_ready, kTileBytes);
        load_boxes<Cfg>(s, h.prefetch_box(t), &s.c_ready);
      } else {
        mbar_arrive(&s.c_ready);
      }
      s.c_offers = n + 1;
    }
  }

  // Consumers, after retire: tile t staged into s.c, and combined where the
  // hooks say so (the prefetched term summed in as it is staged).
  template <class Thr, class Acc, class Phase>
  static CUTE_DEVICE void stage_combined(const P& p, S& s, gemm::TileCoord t, Hooks& h, int ctid, InFlight& f,
                                         const Thr& thr, const Acc& acc, const Phase& phase) {
    if constexpr (kPrefetch) {
      if (prefetches(p, h, t)) {
        mbar_wait(&s.c_ready, f.c_phase, "producer's prefetch offer");
        f.c_phase ^= 1;
        // Every consumer reads c_loaded; the producer writes it again only
        // after c_free, which thread 0 arrives on after the consumers' barrier
        // that follows this read (consume_tile: the whole tile is staged).
        // racecheck does not follow that chain and reports the pair (2026-12-01).
        if (s.c_loaded) {  // the term has landed in s.c
          stage_tile<Cfg, OutT, kBoxes, /*kAddStaged=*/true>(s, thr, acc);
          phase(gemm::TilePhase::kStaged);
          phase(gemm::TilePhase::kCombined);
          return;
        }
      }
    }
    stage_tile<Cfg, OutT, kBoxes>(s, thr, acc);
    phase(gemm::TilePhase::kStaged);
    if constexpr (gemm::combines_v<Hooks>) {
      combine(h, s, t, ctid);
      phase(gemm::TilePhase::kCombined);
    }
  }

  // Consumers: compute output tile t and store it (see epilogue.cuh). ctid is
  // the thread's index among the consumer threads.
  static CUTE_DEVICE void consume_tile(const P& p, S& s, Ring& ring, gemm::TileCoord t, Hooks& h, int ctid,
                                       InFlight& f) {
    typename Cfg::TiledMma mma;
    auto thr = mma.get_thread_slice(ctid);
    Tensor acc = partition_fragment_C(mma, Shape<BM, BN>{});
    auto phase = [&](gemm::TilePhase ph) {  // trace builds only (gemm/tile_hooks.h tile_phase)
      if constexpr (gemm::traces_tiles_v<Hooks>) {
        if (ctid == 0) h.tile_phase(t, ph);
      }
    };
    phase(gemm::TilePhase::kClaimed);
    const bool frees = ctid == 0 && prefetches(p, h, t);
    mainloop(p, s, ring, thr, acc, [&](int k, int kblocks) {
      if (frees && frees_at(k, kblocks)) {
        bulk_wait_reads();
        mbar_arrive(&s.c_free);
      }
    });
    phase(gemm::TilePhase::kComputed);
    if constexpr (Cfg::kSmemEpilogue) {
      if (smem_epilogue(p)) {
        retire<false>(s, f, ctid);
        stage_combined(p, s, t, h, ctid, f, thr, acc, phase);
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
    if constexpr (gemm::combines_v<Hooks>) {  // combining hooks need the staged tile
      if (h.combines(t)) __trap();             // (their launchers keep N % 8 == 0)
    }
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
      if (prefetches(p, h, t)) offer_prefetch(s, t, h);
      mailbox.advance(2);
    }
  }

  static CUTE_DEVICE void consume_all(const P& p, S& s, Hooks& h, int ctid) {
    Ring stages, mailbox;
    InFlight inflight;
    for (;;) {
      mbar_wait(&s.claim_full[mailbox.slot], mailbox.phase, "claim slot full");
      // Lane 0 alone reads the slot, frees it and hands the claim to its warp
      // by shuffle, so the slot's readers are exactly the threads whose
      // arrives the producer waits for. (When every lane read it, the other
      // lanes' reads were ordered before lane 0's arrive by __syncwarp, which
      // the PTX memory model makes enough but compute-sanitizer's racecheck
      // does not follow: it reported them against the producer's next write
      // to the slot, 2026-12-01.)
      int claim[3] = {0, 0, 0};
      if (threadIdx.x % 32 == 0) {
        claim[0] = s.claim[mailbox.slot].m, claim[1] = s.claim[mailbox.slot].n, claim[2] = s.claim_valid[mailbox.slot];
        mbar_arrive(&s.claim_empty[mailbox.slot]);
      }
      const gemm::TileCoord t{__shfl_sync(0xffffffffu, claim[0], 0), __shfl_sync(0xffffffffu, claim[1], 0)};
      const bool ok = __shfl_sync(0xffffffffu, claim[2], 0) != 0;
      if (!ok) break;
      consume_tile(p, s, stages, t, h, ctid, inflight);
      mailbox.advance(2);
    }
    // The staged buffer is shared memory a fused kernel may reuse after the
    // engine, and the last tile's tile_done is still due.
    if (smem_epilogue(p)) retire<true>(s, inflight, ctid);
    if constexpr (Hooks::kTileDone) {
      if (ctid == 0) post_done(s, gemm::TileCoord{0, 0}, false);
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
        if (threadIdx.x == kPublisherThread) publish_all(s, h);
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
