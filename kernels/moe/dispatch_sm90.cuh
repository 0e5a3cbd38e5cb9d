// The Hopper megakernels' dispatch copies: a mover's rows go into the arena by
// bulk copies (cp.async.bulk, the TMA unit's descriptor-free copies) through a
// ring of shared memory per warp, instead of a warp's 16-byte loads and
// stores (moe_copy_row). A warp copying through registers holds one row's
// loads in flight and pays their latency per row; traced (benchmarks/
// RESULTS.md, 2026-12-08) Qwen3-30B-A3B's 16 movers gathered ~22 GB/s each
// while GEMM1's builders waited for rows. Bulk copies hold no registers, so a
// warp keeps kDispatchSlots - 1 chunks loading while the TMA unit stores the
// oldest, and its lanes only scale rows under input gating.
//
// Memory model: a chunk's load completes on its slot's mbarrier (the TMA
// unit's async proxy writes the slot; the waiter then sees them), its store
// reads the slot through the same proxy; a gated chunk's generic scaling is
// fenced to the async proxy before the store is issued. A slot is loaded again
// only once the store that read it last has finished reading (bulk group
// order: every group but the most recent). At the part's end each warp's
// issuing lane waits for its stores' global writes and fences them to the
// generic proxy before the CTA barrier that precedes the part's release.
#pragma once
#include <cstdint>

#include "gemm/sm90/barrier.cuh"
#include "gemm/sm90/bulk_store.cuh"
#include "kosmos/types.h"

namespace kosmos::moe {

// A chunk of a row: the bulk copies' unit. Per warp kDispatchSlots of them,
// carved from the engine's A and B rings (idle while a mover dispatches).
constexpr int kDispatchChunkBytes = 2048;
constexpr int kDispatchSlots = 6;
constexpr int kDispatchRingBytes = kDispatchSlots * kDispatchChunkBytes;  // a warp's

template <class Storage>
constexpr bool moe_dispatch_fits_rings(int warps) {
  return offsetof(Storage, b) - offsetof(Storage, a) == sizeof(Storage::a) &&
         sizeof(Storage::a) + sizeof(Storage::b) >= (size_t)warps * kDispatchRingBytes;
}

// A warp's slots' state, in static shared memory (the rings' bytes are the
// engine's between dispatches; the barriers live for the launch).
struct MoeDispatchRing {
  uint64_t full[kDispatchSlots];  // a chunk's load has landed (one arrival + its bytes)
  bf16_t* to[kDispatchSlots];     // where the chunk goes
  uint32_t bytes[kDispatchSlots];
  float w[kDispatchSlots];        // its row's gating weight
  uint32_t chunks;                // through this ring so far: each slot's use count is its parity
};

// Every CTA, before its first barrier: the warps' rings (uninitialised static
// shared memory) ready; that barrier orders them before any use.
KOSMOS_DEVICE void moe_dispatch_rings_init(MoeDispatchRing* rings, int warps) {
  for (int i = threadIdx.x; i < warps * kDispatchSlots; i += blockDim.x)
    sm90::mbar_init(&rings[i / kDispatchSlots].full[i % kDispatchSlots], 1);
  if (threadIdx.x < warps) rings[threadIdx.x].chunks = 0;
  sm90::mbar_init_fence();
}

// Bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned)
// from global to shared memory, completing on `bar` (which expects them).
KOSMOS_DEVICE void bulk_load(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   sm90::smem_u32(smem)),
               "l"(gmem), "r"(bytes), "r"(sm90::smem_u32(bar))
               : "memory");
}

// One warp's pipeline over its ring for one dispatch part (every lane holds
// the same counts; lane 0 issues).
struct MoeBulkDispatch {
  MoeDispatchRing* ring;  // this warp's
  char* slots;            // this warp's kDispatchRingBytes of the rings
  uint32_t issued, retired;

  KOSMOS_DEVICE MoeBulkDispatch(MoeDispatchRing* r, char* sl) : ring(r), slots(sl), issued(r->chunks), retired(r->chunks) {}

  // The oldest chunk: wait for its load, scale it (gated), store it.
  KOSMOS_DEVICE void retire(int lane, bool gated) {
    const int s = retired % kDispatchSlots;
    const uint32_t parity = (retired / kDispatchSlots) & 1;
    if (gated) {
      sm90::mbar_wait(&ring->full[s], parity, "moe dispatch chunk");
      uint4* v = reinterpret_cast<uint4*>(slots + s * kDispatchChunkBytes);
      const float w = ring->w[s];
      for (uint32_t j = lane; j < ring->bytes[s] / 16; j += 32) {
        uint4 u = v[j];
        bf16_t* h = reinterpret_cast<bf16_t*>(&u);
#pragma unroll
        for (int e = 0; e < 8; ++e) h[e] = from_f32<bf16_t>(__fmul_rn(w, to_f32(h[e])));
        v[j] = u;
      }
      sm90::smem_to_async_proxy_fence();
      __syncwarp();
    }
    if (lane == 0) {
      if (!gated) sm90::mbar_wait(&ring->full[s], parity, "moe dispatch chunk");
      sm90::bulk_store(ring->to[s], slots + s * kDispatchChunkBytes, ring->bytes[s]);
      sm90::bulk_commit();
    }
    ++retired;
  }

  // Row `from` [n] into `to` [n], chunk by chunk; w: its gating weight.
  KOSMOS_DEVICE void push(const bf16_t* from, bf16_t* to, int n, float w, int lane, bool gated) {
    const uint32_t bytes = n * sizeof(bf16_t);
    for (uint32_t off = 0; off < bytes; off += kDispatchChunkBytes) {
      // One slot stays with the store in flight: the slot loaded next was read
      // by an older store, which "all but the most recent group" covers.
      if (issued - retired == kDispatchSlots - 1) retire(lane, gated);
      const int s = issued % kDispatchSlots;
      if (lane == 0) {
        const uint32_t c = bytes - off < kDispatchChunkBytes ? bytes - off : kDispatchChunkBytes;
        ring->to[s] = to + off / sizeof(bf16_t);
        ring->bytes[s] = c;
        ring->w[s] = w;
        sm90::bulk_wait_reads_but_last();
        // The arrival releases the slot's fields above to the chunk's waiters.
        sm90::mbar_arrive_expect_tx(&ring->full[s], c);
        bulk_load(slots + s * kDispatchChunkBytes, from + off / sizeof(bf16_t), c, &ring->full[s]);
      }
      ++issued;
    }
  }

  // Every chunk stored and its writes landed (lane 0's; the caller's CTA
  // barrier then orders them before the part's release).
  KOSMOS_DEVICE void drain(int lane, bool gated) {
    while (retired != issued) retire(lane, gated);
    if (lane == 0) {
      sm90::bulk_wait_writes();
      ring->chunks = issued;
    }
    __syncwarp();
  }
};

}  // namespace kosmos::moe
