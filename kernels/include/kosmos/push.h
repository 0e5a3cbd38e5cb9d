// Push transport: a producer writes its rows (AG) or partials (RS) straight into
// the CONSUMER's heap, once the consumer has announced that region free for
// this epoch (its ready[] flag, released at system scope into the producer's
// control block, so the producer polls locally). The producer then releases the
// landing flag in the consumer's control block at system scope: the writes and
// their release are on another GPU than the reader. Generic-store producers
// (movers) order every thread's stores before thread 0's release with a CTA
// barrier; TMA-store producers (the Hopper epilogue) first complete and fence
// their async writes on the issuing thread (kosmos/proxy.h
// fence_async_writes_to_release, which the Hopper engine runs before every
// tile_done), which is what makes them visible to the release over NVLink. A consumer acquires the
// landing flag at system scope, and fences to the async proxy before TMA reads.
// One NVLink crossing per row, paid by the producer, whose stores do not wait.
// The announcement is this type's (announce_ready: AG's, GEMM+RS's and bulk
// RS's), and so is a mover's CTA-wide wait for it (wait_ready: AG's and bulk
// RS's movers; GEMM+RS's builders wait on their claimer thread, in their
// hooks). PushFold: GEMM+RS's push whose owner sums its own chunk in its
// builders' epilogues (tp/rs_sched.h, fold).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kosmos/platform.h"
#include "kosmos/proxy.h"
#include "kosmos/sync.h"
#include "kosmos/trace.h"

namespace kosmos {

struct Push {
  static constexpr bool kPush = true;
  static constexpr bool kFold = false;
  static constexpr const char* kName = "push";
  // The landing flag's writer is the producer, on another GPU.
  static constexpr Scope kLanded = Scope::kSys;

  // The rank whose heap holds what `producer` made for `consumer`: the consumer's.
  KOSMOS_HD static int home(int /*producer*/, int consumer) { return consumer; }

  // A TMA reader's wait for rows a peer pushed here: acquire, then the proxy fence.
  KOSMOS_DEVICE static void wait_landed_for_tma(const uint64_t* flag, uint64_t epoch, uint64_t timeout_ns,
                                                const WaitSite& site) {
    wait_ge<kLanded>(flag, epoch, timeout_ns, site);
    fence_acquire_to_async();
  }

#ifdef KOSMOS_GPU
  // Thread 0, once this rank's landing region is free for `epoch` (its last
  // readers are done, tp/heap_use.cuh): ready[rank] = epoch in every peer's
  // control block (`ready_off` from each heap base, the same on every rank). A
  // remote store, so the producers poll their own control block, not a remote one.
  KOSMOS_DEVICE static void announce_ready(char* const* heap, size_t ready_off, uint64_t epoch, int tp, int rank) {
    if (threadIdx.x == 0)
      for (int r = 0; r < tp; ++r)
        if (r != rank) store_release<Scope::kSys>(reinterpret_cast<uint64_t*>(heap[r] + ready_off) + rank, epoch);
  }

  // CTA-wide, before a producer's stores into `consumer`'s region: thread 0
  // waits until the consumer announced it for `epoch` (ready: the ready[] of
  // our control block); the barrier keeps every thread's stores behind that
  // acquire. The timeout report names `kernel` and `rank`; `item` is the
  // trace's work item. (The report is built inside thread 0's branch: built
  // by the caller, the Hopper AG push kernel spilled 32 more bytes, ptxas.)
  KOSMOS_DEVICE static void wait_ready(const uint64_t* ready, int consumer, uint64_t epoch, uint64_t timeout_ns,
                                       const char* kernel, int rank, const TraceBuf& trace, int item) {
    const TraceSpan wait;
    if (threadIdx.x == 0) {
      wait_ge<Scope::kSys>(&ready[consumer], epoch, timeout_ns,
                           {kernel, rank, (int)blockIdx.x, "peer_ready", consumer});
      wait.close(trace, blockIdx.x, kTraceWait, item);
    }
    __syncthreads();
  }
#endif
};

// GEMM+RS's push with the fold: the owner's builders sum its own chunk (the
// peers' pushed partials and their own) in their epilogues; nobody reduces.
struct PushFold : Push {
  static constexpr bool kFold = true;
  static constexpr const char* kName = "push_fold";
};

}  // namespace kosmos
