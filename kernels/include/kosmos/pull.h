// Pull transport: a producer leaves its rows (AG) or partials (RS) in its OWN
// heap and releases their flag there at system scope (peers on other GPUs read
// them); the consumer's movers (AG) or reducers (RS) acquire that flag at system
// scope and copy across NVLink with L2-only loads (kosmos/transport.h load_cg).
// A mover that lands rows in its own heap for this GPU's builders releases the
// landing flag at GPU scope: the copy and the release are this GPU's. A builder
// that TMA-loads landed rows acquires that flag, then fences to the async proxy.
// One NVLink crossing per row, paid by the consumer; the producer never waits.
// The schedules (tp/ag_sched.h, tp/rs_sched.h) and the device ops take the
// transport as a template parameter, so a kernel compiles one transport's code.
#pragma once
#include <cstdint>

#include "kosmos/platform.h"
#include "kosmos/proxy.h"
#include "kosmos/sync.h"

namespace kosmos {

struct Pull {
  static constexpr bool kPush = false;
  static constexpr bool kFold = false;  // GEMM+RS's fold is a push (kosmos/push.h PushFold)
  static constexpr const char* kName = "pull";
  // Scope of the flag that says rows landed in this rank's memory: set by this
  // GPU's movers.
  static constexpr Scope kLanded = Scope::kGpu;

  // The rank whose heap holds what `producer` made for `consumer`: the producer's.
  KOSMOS_HD static int home(int producer, int /*consumer*/) { return producer; }

  // A TMA reader's wait for landed rows: acquire, then the proxy fence.
  KOSMOS_DEVICE static void wait_landed_for_tma(const uint64_t* flag, uint64_t epoch, uint64_t timeout_ns,
                                                const WaitSite& site) {
    wait_ge<kLanded>(flag, epoch, timeout_ns, site);
    fence_acquire_to_async();
  }
};

}  // namespace kosmos
