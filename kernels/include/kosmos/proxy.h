// The generic proxy (ordinary loads and stores, flag atomics) and the async
// proxy (TMA loads and stores, cp.async.bulk) reach memory by separate paths,
// so data handed between them through a flag needs a proxy fence on each side.
// On one GPU a single L2 serves both and hides a missing fence; over NVLink it
// does not: NCCL-EP added the producer fence (commit 3f29db27) because TMA data
// and flag atomics travel separately there, and DeepEP issue 621 read stale data
// without the consumer one. The transports (kosmos/pull.h, kosmos/push.h) are
// the only callers, so a kernel that uses a transport cannot leave them out.
// No-ops where there is no separate async proxy (portable builds, HIP, sm < 90).
#pragma once
#include "kosmos/platform.h"

namespace kosmos {

// Consumer: after the acquire that saw the data's flag, before TMA reads the data.
KOSMOS_DEVICE void fence_acquire_to_async() {
#if defined(KOSMOS_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}

// Producer, on the thread that issued the TMA (bulk) stores: waits until their
// global writes are complete and orders them before this thread's later generic
// accesses, so a release after this (on this thread, or one it hands off to
// through a CTA-scope release/acquire) publishes them.
KOSMOS_DEVICE void fence_async_writes_to_release() {
#if defined(KOSMOS_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}

}  // namespace kosmos
