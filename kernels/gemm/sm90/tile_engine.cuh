// Hopper tile engine: the schedule. One CTA = one producer warp group + two
// consumer warp groups (WGMMA), joined by a ring of shared-memory stages
// guarded by mbarriers. In the producer warp group one thread claims tiles,
// one issues their TMA loads and, for hooks that publish tiles, one publishes.
//
// Interface for persistent kernels: every thread of the CTA calls
// run(params, smem, scheduler, hooks). The claimer thread takes tiles from the
// scheduler, waits for each one's inputs (the hooks' before_tile) and posts it
// in a 2-slot shared-memory mailbox; the loading thread and the consumers read
// every claim, the one to stream the tile's k-blocks into the ring, the others
// to compute "output tile (m, n) of this problem". A claim and its waits are
// round trips to L2 (the queue's atomic, the binary search of a grouped
// GEMM's layout, a flag's acquire, which also drops the SM's L1): made by the
// loading thread they sat between one tile's last load and the next one's
// first, hidden only by the ring's stages (~1.7 us of 128x256 k-blocks); the
// claimer makes them a tile ahead (the MoE backward 0.90-0.94x main's time,
// 1xH200, 2026-12-05). The loading thread runs ahead into the next
// tile while the consumers finish and store the current one, and with the
// staged epilogue the stored tile's copies run under the next tile's mainloop.
// Hooks: gemm/tile_hooks.h; how a tile enters the staged buffer: Staging
// (gemm/sm90/staging.cuh; PlainStaging unless an op brings its own).
//
// This file: the roles and their hand-offs (claims, register shares); one
// tile's loads are gemm/sm90/tile_loads.cuh, its compute and epilogue
// gemm/sm90/tile_compute.cuh.
#pragma once
#include "gemm/sm90/barrier.cuh"
#include "gemm/sm90/publisher.cuh"
#include "gemm/sm90/staging.cuh"
#include "gemm/sm90/tile_compute.cuh"
#include "gemm/sm90/tile_config.cuh"
#include "gemm/sm90/tile_loads.cuh"
#include "gemm/tile_hooks.h"

namespace kosmos::sm90 {

template <class Cfg, class OutT, class Hooks, template <class, class, bool, class> class Staging = PlainStaging>
struct TileEngine {
  using P = Params<Cfg>;
  using S = SharedStorage<Cfg>;
  using Loads = TileLoads<Cfg, Hooks>;
  using Compute = TileCompute<Cfg, OutT, Hooks, Staging>;
  using Stage = typename Compute::Stage;
  using Pub = typename Compute::Pub;
  static constexpr int kStages = Cfg::kStages;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128*40 + 256*232 <= 64K
  static constexpr int kEvenRegs = 65536 / Cfg::kThreads / 8 * 8;  // 168 for 384 threads
  // Producer warp group: warp 0 loads, warp 1 publishes (Pub::kThread), warp 2 claims.
  static constexpr int kClaimerThread = 64;

  // One thread: barrier counts, then make them visible to TMA and all threads.
  static CUTE_DEVICE void init(const P& p, S& s) {
    if (threadIdx.x == 0) {
      for (int i = 0; i < kStages; ++i) {
        mbar_init(&s.full[i], 1);                      // the producer's arrive_expect_tx
        mbar_init(&s.empty[i], Cfg::kConsumerWarps);  // every consumer warp done reading
      }
      for (int i = 0; i < 2; ++i) {
        mbar_init(&s.claim_full[i], 1);
        mbar_init(&s.claim_empty[i], Cfg::kConsumerWarps + 1);  // and the loading thread
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

  // Claimer thread: a free mailbox slot, then claim, wait for the tile's
  // inputs, post; a final invalid claim ends the CTA. A slot frees when the
  // consumers start a tile, so the claim for the tile after the one being
  // loaded has a whole tile's time to land. Claiming before a slot is free
  // held tiles longer than that buys: Qwen3-30B-A3B's forward took 1.056x
  // main's time so, 0.98x this way (1xH200, 2026-12-05, benchmarks/RESULTS.md).
  template <class Sched>
  static CUTE_DEVICE void claim_all(S& s, Sched& sched, Hooks& h) {
    Ring mailbox;
    for (;;) {
      mbar_wait(&s.claim_empty[mailbox.slot], mailbox.phase ^ 1, "claim slot empty");
      gemm::TileCoord t{0, 0};
      const bool ok = sched.next(t);
      if (ok) h.before_tile(t);
      s.claim[mailbox.slot] = t;
      s.claim_valid[mailbox.slot] = ok;
      mbar_arrive(&s.claim_full[mailbox.slot]);  // release: the slot's stores, and what before_tile acquired
      if (!ok) return;
      mailbox.advance(2);
    }
  }

  // Loading thread: every posted tile's loads. The claimer acquired the tile's
  // inputs and released them to this thread through the mailbox (CTA scope);
  // this thread's proxy fence then carries them to its TMA reads (async proxy).
  static CUTE_DEVICE void load_all(const P& p, S& s, Hooks& h) {
    Ring stages, mailbox;
    Stage stage;
    for (;;) {
      mbar_wait(&s.claim_full[mailbox.slot], mailbox.phase, "claim slot full");
      const gemm::TileCoord t = s.claim[mailbox.slot];
      const bool ok = s.claim_valid[mailbox.slot] != 0;
      mbar_arrive(&s.claim_empty[mailbox.slot]);
      if (!ok) return;
      gemm::async_proxy_fence();
      Loads::produce_tile(p, s, stages, t, h);
      stage.after_loads(p, s, t, h);
      mailbox.advance(2);
    }
  }

  static CUTE_DEVICE void consume_all(const P& p, S& s, Hooks& h, int ctid) {
    Ring stages, mailbox;
    typename Compute::InFlight inflight;
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
      Compute::consume_tile(p, s, stages, t, h, ctid, inflight, stage);
      mailbox.advance(2);
    }
    // The staged buffer is shared memory a fused kernel may reuse after the
    // engine, and the last tile's tile_done is still due.
    if (smem_epilogue(p)) Compute::template retire<true>(s, inflight, ctid);
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
      if (threadIdx.x == 0) load_all(p, s, h);
      if (threadIdx.x == kClaimerThread) claim_all(s, sched, h);
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
