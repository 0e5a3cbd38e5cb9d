// GPU-to-GPU copy through the TMA unit (sm_90): one thread streams chunks
// global -> shared -> global with bulk async copies (cp.async.bulk), through a
// ring of Slots chunk buffers in shared memory.
//
// Why: cta_copy16 keeps 4 x 16 bytes in flight per thread, so it takes 8-16
// CTAs of 512 threads to fill an NVLink (benchmarks/RESULTS.md, transport); every
// one of those SMs is lost to the GEMM while it moves. A bulk copy keeps
// Slots x kBulkChunk bytes in flight from one thread, so a few CTAs might do the
// same. On one H200 (copies within it, benchmarks/RESULTS.md 2026-12-01
// session 20) it did not: one CTA copied ~50 GB/s with 8 slots, cta_copy16 at
// 512 threads ~48, so a CTA's rate is its SM's, not its loads in flight; the
// AG push movers through it timed the same as with cta_copy16, so no kernel
// uses it. Across GPUs not yet measured (transport_bench.cu has its rows).
//
// Pull (src on a peer) or push (dst on a peer): the same code. Both pointers
// 16-byte aligned. The caller acquires whatever flag published src before the
// call (this function then orders that acquire before its TMA reads), and after
// it every byte is written (async-proxy writes completed and ordered before the
// caller's release).
#pragma once
#include <cstddef>
#include <cstdint>

#include "gemm/sm90/barrier.cuh"     // mbarriers, with bounded waits
#include "gemm/sm90/bulk_store.cuh"  // shared -> global bulk copies
#include "kosmos/platform.h"

namespace kosmos {

constexpr uint32_t kBulkChunk = 16384;  // bytes per bulk copy (a multiple of 16)

// Bulk copy global -> this CTA's shared memory, completing `bytes` of
// transaction count on the mbarrier `bar`.
KOSMOS_DEVICE void bulk_load(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   sm90::smem_u32(smem)),
               "l"(gmem), "r"(bytes), "r"(sm90::smem_u32(bar))
               : "memory");
}

KOSMOS_DEVICE void mbar_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(sm90::smem_u32(bar)) : "memory");
}

// Thread 0 of the CTA: copies the whole 16-byte vectors of [src, src + bytes).
// ring: Slots x kBulkChunk bytes of shared memory (128-byte aligned); bars:
// Slots mbarriers, initialised here and invalidated before returning, so calls
// may follow each other.
template <int Slots>
KOSMOS_DEVICE void bulk_copy_vectors(char* dst, const char* src, size_t bytes, char* ring, uint64_t* bars) {
  static_assert(Slots >= 2, "a slot is refilled only after the next chunk's store is issued");
  const size_t n = (bytes + kBulkChunk - 1) / kBulkChunk;
  auto len = [&](size_t c) { return (uint32_t)(bytes - c * kBulkChunk < kBulkChunk ? bytes - c * kBulkChunk : kBulkChunk); };
  auto load = [&](size_t c) {
    const int s = (int)(c % Slots);
    sm90::mbar_arrive_expect_tx(&bars[s], len(c));
    bulk_load(ring + (size_t)s * kBulkChunk, src + c * kBulkChunk, len(c), &bars[s]);
  };
  for (int s = 0; s < Slots; ++s) sm90::mbar_init(&bars[s], 1);
  sm90::mbar_init_fence();
  // Generic-proxy writes this thread acquired (a peer's published data) before
  // the TMA reads them (tile_hooks.h: the async proxy is not ordered otherwise).
  asm volatile("fence.proxy.async.global;" ::: "memory");
  for (size_t c = 0; c < n && c < (size_t)Slots; ++c) load(c);
  for (size_t c = 0; c < n; ++c) {
    const int s = (int)(c % Slots);
    sm90::mbar_wait(&bars[s], (uint32_t)((c / Slots) & 1), "bulk copy chunk landed");
    sm90::bulk_store(dst + c * kBulkChunk, ring + (size_t)s * kBulkChunk, len(c));
    sm90::bulk_commit();
    // The slot of chunk c - 1 is free once its store has read it: every bulk
    // group but the newest (chunk c's) has.
    if (c >= 1 && c - 1 + Slots < n) {
      asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      load(c - 1 + Slots);
    }
  }
  sm90::bulk_wait_writes();
  for (int s = 0; s < Slots; ++s) mbar_inval(&bars[s]);
}

// Copies `bytes` from src to dst; called by every thread of the CTA, of which
// thread 0 does the work (the TMA unit needs no more) and the rest wait at the
// closing CTA barrier.
template <int Slots>
KOSMOS_DEVICE void cta_copy_bulk(void* dst, const void* src, size_t bytes, char* ring, uint64_t* bars) {
  if (threadIdx.x == 0) {
    const size_t whole = bytes / 16 * 16;
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    if (whole > 0) bulk_copy_vectors<Slots>(d, s, whole, ring, bars);
    for (size_t i = whole; i < bytes; ++i) d[i] = s[i];  // at most 15 bytes
  }
  __syncthreads();
}

}  // namespace kosmos
