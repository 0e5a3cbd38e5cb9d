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
#pragma once
#include <cstdint>

#include "kosmos/platform.h"
#include "kosmos/proxy.h"
#include "kosmos/sync.h"

namespace kosmos {

struct Push {
  static constexpr bool kPush = true;
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
};

}  // namespace kosmos
