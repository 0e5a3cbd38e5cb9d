// The points where a fused kernel plugs into a tile engine. Both engines call
// the same hooks at the same moments, so a fused kernel written against the
// portable engine runs unchanged on the Hopper one.
//
//  before_tile(t)      the claiming thread, before the first load of tile t.
//                      Fused kernels wait here for the rows of A (or B) that the
//                      tile reads (acquire), e.g. AG chunks delivered by movers.
//  before_k(t, k0)     the same thread, before loading k-block [k0, k0 + BK).
//                      For producers whose contraction rows arrive in pieces
//                      (wgrad over gathered tokens).
//  tile_done(t)        one thread, after every thread has stored tile t and
//                      the stores are complete. Fused kernels release the
//                      tile's flag here (GEMM+RS). The Hopper engine's staged
//                      epilogue calls it one tile late (after the CTA's next
//                      mainloop, or before the engine returns), so a tile's
//                      loads must never wait on this CTA's earlier tile_done.
//  row_ptr<OutT>(t, r) (Hopper epilogue, when kMapsRows) where row r of the
//                      engine's C goes: element (r, c) is stored at
//                      row_ptr(t, r)[c], nullptr skips the row. Fused kernels
//                      scatter gathered rows (AG) or stage whole tiles (RS).
//
// The Hopper engine loads with TMA (the async proxy). Data another CTA or GPU
// wrote with ordinary stores is visible to TMA only after the acquiring thread
// also runs fence.proxy.async (DeepEP issue 621): a hook that acquires must
// call async_proxy_fence() before it returns.
#pragma once
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

// A plain GEMM: nothing to wait for, nothing to publish.
struct NoHooks {
  static constexpr bool kTileDone = false;  // engines skip the store barrier when false
  static constexpr bool kMapsRows = false;  // C is the Problem's row-major [M, N]
  KOSMOS_DEVICE void before_tile(TileCoord) {}
  KOSMOS_DEVICE void before_k(TileCoord, int) {}
  KOSMOS_DEVICE void tile_done(TileCoord) {}
};

}  // namespace kosmos::gemm
