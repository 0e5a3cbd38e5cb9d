// The points where a fused kernel plugs into a tile engine. Both engines
// (gemm/portable/tile_engine.cuh, gemm/sm90/tile_engine.cuh) have
// run(problem, smem, sched, hooks): every thread of the CTA calls it; one
// claiming thread (portable: thread 0; Hopper: the claimer thread) calls
// sched.next(t) for each tile until it returns false, and both engines call
// the hooks below at the same moments with the same meaning. So a fused op
// has one schedule, one CTA life and one hooks design for both engines; its
// hooks differ only where an engine names memory its own way (a_source: a
// TMA descriptor or a pointer) and in the Hopper epilogue's extra hooks,
// which the portable engine refuses at compile time. An op whose epilogue does
// more than store the tile brings it as the Hopper engine's staging type
// (gemm/sm90/staging.cuh; GEMM+RS's fold, tp/rs_fold_sm90.cuh), not as hooks;
// on the portable engine it runs the engine's mainloop and stores the
// accumulators itself (the MoE GEMM1's SwiGLU, moe/fwd_portable.cuh).
//
//  before_tile(t)      the claiming thread, before the first load of tile t
//                      (portable: a CTA barrier then orders every thread's
//                      loads after it; Hopper: the claim's post in the
//                      mailbox, then the loading thread's proxy fence). Fused
//                      kernels wait here for the rows of A (or B) that the
//                      tile reads (acquire), e.g. AG chunks delivered by
//                      movers. Hopper: up to two claims ahead of the tile the
//                      consumers compute, so it must not wait on this CTA's
//                      earlier tiles of the same engine run.
//  before_k(t, k0)     the loading thread (portable: thread 0), before loading
//                      k-block [k0, k0 + BK).
//                      For producers whose contraction rows arrive in pieces
//                      (wgrad over gathered tokens).
//  tile_done(t)        one thread, after every thread has stored tile t and
//                      the stores are complete. Fused kernels release the
//                      tile's flag here (GEMM+RS). The portable engine calls
//                      it on thread 0 right after the tile (its stores, then a
//                      CTA barrier). The Hopper engine's staged epilogue calls
//                      it one tile late (after the CTA's next mainloop, or
//                      before the engine returns), and from a publisher thread
//                      of its own (lane 0 of producer warp 1, on the producer's
//                      register budget), so a tile's loads must never wait on
//                      this CTA's earlier tile_done.
//  row_ptr<OutT>(t, r) (both engines' epilogues, when kMapsRows) where row r
//                      of the engine's C goes: element (r, c) (the engine's row
//                      and column; columns stop at the Problem's N) is stored
//                      at row_ptr(t, r)[c], nullptr skips the row. Fused
//                      kernels scatter gathered rows (AG) or stage whole tiles
//                      (RS, the portable engine's in fp32).
//  store_box(t)        (Hopper staged epilogue, when kMapsRows and kStoreBoxes)
//                      where tile t leaves by TMA store instead of row_ptr's rows:
//                      an sm90::StoreBox (a TMA descriptor in parameter space over
//                      a row-major bf16 matrix, the tile's row and first column
//                      in it). Hooks without kMapsRows store C through the
//                      engine's own descriptor (Params::tma_c).
//  a_source(t, &rows, &tile_m)  (when kSplitA) before tile t's loads, another A
//                      for tile t, with that A's row count (rows past it read as
//                      zeros) and the tile's row in it; nullptr reads the
//                      Problem's A. Hopper: the claiming thread, a pointer to
//                      that A's TMA descriptor (parameter space). Portable:
//                      every thread (so a pure function of t), a pointer to
//                      that A's elements in the Problem's A major, read L2-only
//                      (movers and peers write it during the launch). AG+GEMM
//                      reads its own shard straight from x this way (Hopper:
//                      under push and for ag_nn), and the portable builders
//                      every shard's rows and GEMM+RS's chunks.
//  b_source(t)         (Hopper engine, when kBSource) the loading thread,
//                      before tile t's loads: another B for tile t (a TMA
//                      descriptor in parameter space, the Problem's N and K),
//                      or nullptr for the Problem's B. The MoE forward's shared
//                      expert tiles read its own down weights this way. The
//                      portable engine's tiles name their B per call instead.
//  b_kblock0(t)        (Hopper engine, when kGroupedB) the loading thread,
//                      before tile t's loads: the k-block of B where tile t's
//                      contraction starts. B then holds several [K, ...]
//                      operands stacked along k (a grouped GEMM's experts,
//                      x @ W[e]: [E * K, N]), its TMA descriptor spans them all, and tile
//                      t reads k-blocks [b_kblock0, + K / kBK) of it. The
//                      portable engine refuses it at compile time.
//  b_row0(t)           (Hopper engine, when kRowsB) the loading thread, before
//                      tile t's loads: the row of B (engine n) where tile t's
//                      operand starts. B then holds several [N, K] operands
//                      stacked along n (a grouped dgrad's experts, dY @ W[e]^T
//                      with W [E, N, K] K-major: [E * N, K]); tile t reads rows
//                      [b_row0 + t.n * kBN, + kBN) of it, so an operand's rows
//                      past N (the next one's) reach only columns past N,
//                      which no store keeps.
//  k_range(t, &a_kb0, &b_kb0, &kblocks)  (Hopper engine, when kKRange) the
//                      loading thread and every consumer thread (so a pure
//                      function of t), before tile t: tile t contracts kblocks
//                      k-blocks, A's from a_kb0 and B's from b_kb0 (after
//                      b_kblock0's offset); kblocks may be 0 (the tile is
//                      zeros). A grouped weight gradient's experts are row
//                      ranges of its contraction (X[e]^T @ dY[e]); the two
//                      starts differ where A and B are different arrays (the
//                      MoE shared expert's token rows against its arena rows).
//  kMovedB             (portable engine; a flag, no function) the Problem's B
//                      was written during the launch (the MoE backward's weight
//                      gradients read the gathered dY rows and dgrad2's output),
//                      so it is read L2-only, as a_source's A. TMA reads through
//                      L2 anyway: the Hopper engine has nothing to do for it.
//  b_halves(t, &lo, &hi)  (when kSplitB) before tile t's loads: B's kBN rows of
//                      tile t come as two halves from two row blocks of B,
//                      half-blocks lo and hi (in units of kBN / 2 rows) into the
//                      tile's rows [0, kBN / 2) and [kBN / 2, kBN). Hopper: the
//                      loading thread, read through the returned descriptor
//                      (sm90::Params<Cfg>::TmaBHalf, a half-height box over B,
//                      in parameter space); with kGroupedB, from b_kblock0 on.
//                      Portable: every thread (a pure function of t), the
//                      returned pointer is that B's elements in the Problem's B
//                      major, N and K. The MoE GEMM1 pairs each gate block with
//                      its up block this way, so one accumulator holds both
//                      (moe/swiglu_sm90.cuh, moe/fwd_portable.cuh).
//  tile_phase(t, ph)   (Hopper engine, when kTraceTiles) one consumer thread as
//                      tile t passes each TilePhase, for trace builds' per-tile
//                      spans; hooks declare kTraceTiles only under KOSMOS_TRACE,
//                      so a release build compiles none of it.
//
// The Hopper engine loads with TMA (the async proxy). Data another CTA or GPU
// wrote with ordinary stores is visible to TMA only after the acquiring thread
// also runs fence.proxy.async (DeepEP issue 621). before_tile's acquires (on
// the claimer) reach the loading thread through the claim's mailbox, and that
// thread fences after taking each claim; a hook that acquires on the loading
// thread itself (before_k, a staging's after_loads) must call
// async_proxy_fence() before it returns.
#pragma once
#include <type_traits>

#include "gemm/tile_problem.h"
#include "kosmos/platform.h"

namespace kosmos::gemm {

// Orders this thread's earlier acquires before its later async-proxy (TMA)
// reads. A no-op where there is no separate async proxy.
KOSMOS_DEVICE void async_proxy_fence() {
#if defined(KOSMOS_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async;" ::: "memory");
#endif
}

// name##_v<H>: whether hooks H declare `static constexpr bool Member = true`
// (absent: false), so hooks name only the capabilities they have.
#define KOSMOS_HOOK_FLAG(name, Member)                                                          \
  template <class H, class = void>                                                              \
  struct name : std::false_type {};                                                             \
  template <class H>                                                                            \
  struct name<H, std::void_t<decltype(H::Member)>> : std::bool_constant<H::Member> {};          \
  template <class H>                                                                            \
  inline constexpr bool name##_v = name<H>::value;

KOSMOS_HOOK_FLAG(split_a, kSplitA)          // absent: every tile reads the Problem's A
KOSMOS_HOOK_FLAG(store_boxes, kStoreBoxes)  // absent: mapped rows leave one by one
KOSMOS_HOOK_FLAG(groups_b, kGroupedB)       // absent: every tile reads the Problem's B from k = 0
KOSMOS_HOOK_FLAG(sources_b, kBSource)       // absent: every tile reads the Problem's B
KOSMOS_HOOK_FLAG(splits_b, kSplitB)         // absent: a tile's B rows are one block of kBN
KOSMOS_HOOK_FLAG(rows_b, kRowsB)            // absent: tile n reads B's rows from n * kBN
KOSMOS_HOOK_FLAG(ranges_k, kKRange)         // absent: every tile contracts all of K
KOSMOS_HOOK_FLAG(traces_tiles, kTraceTiles) // absent: no tile_phase calls
KOSMOS_HOOK_FLAG(keeps_preact, kKeepsPreact) // absent: a staging type stores no pre-activations (MoE GEMM1's preact)
KOSMOS_HOOK_FLAG(moved_b, kMovedB)          // absent: B was written before the launch (portable: L1 may cache it)
#undef KOSMOS_HOOK_FLAG

// Where a tile is in the Hopper engine's consumers: its claim read, its
// mainloop done, its accumulators staged (after the previous tile's copies
// retired), combined (the fold's tiles only), its stores issued.
enum class TilePhase : int { kClaimed, kComputed, kStaged, kCombined, kIssued };

// A plain GEMM: nothing to wait for, nothing to publish.
struct NoHooks {
  static constexpr bool kTileDone = false;  // engines skip the store barrier when false
  static constexpr bool kMapsRows = false;  // C is the Problem's row-major [M, N]
  KOSMOS_DEVICE void before_tile(TileCoord) {}
  KOSMOS_DEVICE void before_k(TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(TileCoord) {}
};

}  // namespace kosmos::gemm
