// Hopper tile engine (gemm/sm90/tile_engine.cuh), pingpong consumers
// (TileConfig<..., Pingpong = true>): each consumer warp group computes whole
// tiles of its own, group g the claims j with j % 2 == g, so one group rounds
// and stores its tile while the other's mainloop has the tensor cores.
//
// The loading thread still streams every claim's k-blocks through the one
// ring in claim order, so a group reads every claim: its own to compute, the
// other's to step its ring position past that tile's k-blocks. Two named
// barriers give the groups turns: group g starts claim j's mainloop (j > 0)
// only once claim j - 1's group has issued its last wgmma batch. That order
// is what keeps the tensor cores on one tile at a time, and it also keeps a
// group's parity waits sound after it skips k-blocks: by its turn every stage
// before its tile's first has been waited for full, so no slot's barrier is
// more than one phase behind the phase it waits for. The turn passes when the
// last batch is issued, not completed: passing it after warpgroup_wait<0>
// left the tensor cores idle for about one k-block's batch every tile (the
// branch measured in benchmarks/RESULTS.md ran 1.00-1.21x the cooperative
// tiles' time so).
//
// Each group stages its tile in its own buffer (Cfg::kStagedTiles) and one
// of its threads stores it by TMA; that thread waits for its previous stores
// to have read the buffer before the group writes it again. Hooks that
// publish tiles, map rows or stage their own epilogue are the cooperative
// schedule's (static_asserts below).
#pragma once
#include "gemm/sm90/barrier.cuh"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/sm90/staging.cuh"
#include "gemm/sm90/tile_compute.cuh"
#include "gemm/sm90/tile_config.cuh"
#include "gemm/sm90/tile_loads.cuh"
#include "gemm/tile_hooks.h"

namespace kosmos::sm90 {

template <class Cfg, class OutT, class Hooks>
struct PingpongCompute {
  using P = Params<Cfg>;
  using S = SharedStorage<Cfg>;
  using Loads = TileLoads<Cfg, Hooks>;
  using Compute = TileCompute<Cfg, OutT, Hooks, PlainStaging>;
  static constexpr int kStages = Cfg::kStages;
  static constexpr uint32_t kGroupThreads = 128, kTurnThreads = 2 * kGroupThreads;
  static_assert(Cfg::kPingpong && Cfg::kConsumerWGs == 2, "two groups taking turns");
  static_assert(!Hooks::kTileDone && !Hooks::kMapsRows && !gemm::traces_tiles_v<Hooks>,
                "tiles that are published, row-mapped or traced run on the cooperative schedule");

  // Group g's thread gtid: the groups' claims in turn, until the invalid one.
  static CUTE_DEVICE void consume_all(const P& p, S& s, Hooks& h, int g, int gtid) {
    Ring stages, mailbox;
    typename Cfg::TiledMma mma;
    auto thr = mma.get_thread_slice(gtid);
    bool staged = false;  // this group's buffer was stored from, and may still be being read
    for (int j = 0;; ++j) {
      gemm::TileCoord t{0, 0};
      const bool ok = read_claim(s, mailbox, &t);
      mailbox.advance(2);
      const bool mine = (j & 1) == g;
      if (!mine) {
        if (!ok) break;
        int a_k0 = 0, b_k0 = 0;
        stages.skip(kStages, Loads::k_blocks(p, t, h, &a_k0, &b_k0));
        continue;
      }
      // Claim j - 1's group passes the turn after its mainloop, the invalid
      // claim's included, so every arrive is waited for once.
      if (j > 0) named_barrier(kTurnBarrier + g, kTurnThreads);
      if (!ok) break;
      compute_tile(p, s, stages, t, h, g, gtid, thr, staged);
      staged = true;
    }
    // The buffer is shared memory the kernel may leave with the stores still reading it.
    if (gtid == 0 && staged) bulk_wait_writes();
    named_barrier(kGroupBarrier + g, kGroupThreads);
  }

  // Every consumer warp's lane 0 reads the slot and frees it (as the
  // cooperative consumers do: the producer waits for exactly these arrives).
  static CUTE_DEVICE bool read_claim(S& s, const Ring& mailbox, gemm::TileCoord* t) {
    mbar_wait(&s.claim_full[mailbox.slot], mailbox.phase, "claim slot full");
    int claim[3] = {0, 0, 0};
    if (threadIdx.x % 32 == 0) {
      claim[0] = s.claim[mailbox.slot].m, claim[1] = s.claim[mailbox.slot].n, claim[2] = s.claim_valid[mailbox.slot];
      mbar_arrive(&s.claim_empty[mailbox.slot]);
    }
    *t = gemm::TileCoord{__shfl_sync(0xffffffffu, claim[0], 0), __shfl_sync(0xffffffffu, claim[1], 0)};
    return __shfl_sync(0xffffffffu, claim[2], 0) != 0;
  }

  // Group g: tile t's mainloop in its turn, then its epilogue under the other group's mainloop.
  template <class Thr>
  static CUTE_DEVICE void compute_tile(const P& p, S& s, Ring& stages, gemm::TileCoord t, Hooks& h, int g, int gtid,
                                       const Thr& thr, bool staged) {
    Tensor acc = partition_fragment_C(typename Cfg::TiledMma{}, Shape<typename Cfg::BM, typename Cfg::BN>{});
    int a_k0 = 0, b_k0 = 0;
    const int kblocks = Loads::k_blocks(p, t, h, &a_k0, &b_k0);
    const uint32_t other_turn = kTurnBarrier + (g ^ 1);
    // The mainloop's at_k runs once k-block k's batch is issued and k - 1's completed.
    Compute::mainloop(s, stages, kblocks, thr, acc, [&](int k, int n) {
      if (k == n - 1) named_barrier_arrive(other_turn, kTurnThreads);
    });
    if (kblocks == 0) named_barrier_arrive(other_turn, kTurnThreads);
    if (!smem_epilogue(p)) {
      store_tile<Cfg, OutT>(p, thr, acc, t, h);
      return;
    }
    if (staged) {
      if (gtid == 0) bulk_wait_reads();
      named_barrier(kGroupBarrier + g, kGroupThreads);  // the previous tile's stores have read the buffer
    }
    stage_tile<Cfg, OutT, true>(s, thr, acc, g);
    smem_to_async_proxy_fence();
    named_barrier(kGroupBarrier + g, kGroupThreads);  // the whole tile is staged
    if (gtid == 0) {
      store_boxes<Cfg>(s, StoreBox<typename P::TmaC>{&p.tma_c, p.M, p.N, t.m, t.n * Cfg::kBN}, 0, g);
      bulk_commit();
    }
  }
};

}  // namespace kosmos::sm90
