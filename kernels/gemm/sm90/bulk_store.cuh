// Bulk asynchronous shared -> global copies (cp.async.bulk, no tensor map):
// the Hopper epilogue's way out of shared memory for tiles whose rows a fused
// kernel's hooks map one by one (the other tiles leave by TMA store, which uses
// the same bulk groups: epilogue.cuh). Each copy is a contiguous run of bytes
// (one output row of a tile), so it needs no descriptor.
//
// Completion is per issuing thread, in bulk groups: only the thread that
// issued a copy can wait for it. Raw PTX, like barrier.cuh.
#pragma once
#include <cstdint>

#include "gemm/sm90/barrier.cuh"  // smem_u32
#include "kosmos/platform.h"

namespace kosmos::sm90 {

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared
// memory to global memory through the async proxy, in this thread's current
// bulk group.
KOSMOS_DEVICE void bulk_store(void* gmem, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem), "r"(smem_u32(smem)),
               "r"(bytes)
               : "memory");
}

// Closes this thread's current bulk group (a no-op group when it issued none).
KOSMOS_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Waits until this thread's bulk groups have finished reading shared memory:
// their source may be overwritten. Their global writes may still be in flight.
KOSMOS_DEVICE void bulk_wait_reads() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }

// Waits until this thread's bulk groups have completed their global writes,
// then orders those async-proxy writes before this thread's later generic
// accesses (a release that publishes them must come after this).
KOSMOS_DEVICE void bulk_wait_writes() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Orders this thread's generic shared-memory stores before later async-proxy
// reads of them (the bulk copies another thread issues after a barrier).
KOSMOS_DEVICE void smem_to_async_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

}  // namespace kosmos::sm90
