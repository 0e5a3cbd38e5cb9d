// The Hopper engine's tile_done path (gemm/tile_hooks.h): hooks that publish
// tiles (kTileDone) do it from a thread of their own, lane 0 of producer warp
// 1, handed each retired tile by consumer thread 0 through a 2-slot mailbox.
// tile_done's release fence and its round-trip atomic then run beside the
// consumers' next staging and mainloop: on consumer thread 0 they held its
// warp group (so the tensor cores) ~1 us a tile (trace spans, GEMM+RS
// loopback, 2026-12-01). The publisher waits on nothing but posts, so a posted
// tile is published whatever the consumers wait on next.
#pragma once
#include "gemm/sm90/barrier.cuh"
#include "gemm/sm90/tile_config.cuh"
#include "gemm/tile_problem.h"

namespace kosmos::sm90 {

template <class Cfg, class Hooks>
struct Publisher {
  using S = SharedStorage<Cfg>;
  static constexpr int kThread = 32;
  // It naps between polls (barrier.cuh mbar_wait): a publish a fraction of a
  // microsecond late costs nothing (the fold reads a band a step after its
  // claims), but a spinning warp takes issue slots from a consumer warp.
  static constexpr uint32_t kNapNs = 256;

  // The publisher thread, until the consumers post the end.
  static CUTE_DEVICE void publish_all(S& s, Hooks& h) {
    Ring box;
    for (;;) {
      mbar_wait(&s.done_full[box.slot], box.phase, "retired tile posted", kNapNs);
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
  static CUTE_DEVICE void post(S& s, gemm::TileCoord t, bool valid) {
    const uint32_t n = s.done_posts, slot = n & 1u, phase = (n >> 1) & 1u;
    mbar_wait(&s.done_empty[slot], phase ^ 1, "publisher slot free");
    s.done[slot] = t;
    s.done_valid[slot] = valid;
    s.done_posts = n + 1;
    mbar_arrive(&s.done_full[slot]);
  }
};

}  // namespace kosmos::sm90
