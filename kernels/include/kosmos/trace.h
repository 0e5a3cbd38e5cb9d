// Role timelines: each CTA records spans (role, start, end, work item) that
// kosmos_jax/trace.py turns into a Chrome/Perfetto trace and a PNG like the
// paper's Figure 4. Compiled in only with -DKOSMOS_TRACE; without it the calls
// below are empty inline functions, so kernels call them unconditionally and the
// release build pays nothing (no clock reads, no stores).
#pragma once
#include <cstdint>

#include "kosmos/platform.h"

namespace kosmos {

// Role ids, shared with kosmos_jax/trace.py ROLE_NAMES (same order).
constexpr uint8_t kTraceBuild = 0;   // computing a GEMM tile
constexpr uint8_t kTraceMove = 1;    // moving data to or from a peer
constexpr uint8_t kTraceReduce = 2;  // pulling and summing a band (RS)
constexpr uint8_t kTraceWait = 3;    // spinning on a flag
constexpr uint8_t kTraceIdle = 4;    // setup, finish, anything else

// One span of one CTA: 24 bytes, little-endian, no padding; kosmos_jax/trace.py
// RECORD_DTYPE reads this layout (the field order keeps every field aligned).
struct TraceRecord {
  uint64_t start_ns;  // now_ns(): %globaltimer on CUDA, wall_clock64 * 10 on HIP
  uint64_t end_ns;
  int32_t tile;       // queue index of the work item, -1 for none
  uint16_t cta;
  uint8_t rank;
  uint8_t role;
};
static_assert(sizeof(TraceRecord) == 24, "TraceRecord layout is shared with kosmos_jax/trace.py");

// Per-CTA record lists in device memory: CTA c owns records[c * cap, (c+1) * cap)
// and count[c]. Only thread 0 of a CTA appends, so count needs no atomic; it keeps
// counting past cap so the host can report how many records were dropped. The
// host zeroes count before a traced launch (tracing is a debug mode: unlike the
// kernels' flags it does not need to survive graph replays untouched).
struct TraceBuf {
  TraceRecord* records;  // nullptr: tracing off for this launch
  uint32_t* count;
  uint32_t cap;
  uint8_t rank;
};

// Whether spans are recorded at all (-DKOSMOS_TRACE): code that exists only to
// keep a trace small tests it, so release builds compile none of it.
#ifdef KOSMOS_TRACE
constexpr bool kTraceCompiled = true;
#else
constexpr bool kTraceCompiled = false;
#endif

// Clock for spans; 0 when tracing is compiled out so the timer is never read.
KOSMOS_HD inline uint64_t trace_now() {
#ifdef KOSMOS_TRACE
  return now_ns();
#else
  return 0;
#endif
}

// Appends one span for `cta` (call from thread 0 only).
KOSMOS_HD inline void trace_append(const TraceBuf& tb, int cta, uint8_t role, uint64_t start_ns, uint64_t end_ns,
                                   int32_t tile = -1) {
#ifdef KOSMOS_TRACE
  if (tb.records == nullptr) return;
  const uint32_t n = tb.count[cta]++;
  if (n < tb.cap) tb.records[(uint64_t)cta * tb.cap + n] = {start_ns, end_ns, tile, (uint16_t)cta, tb.rank, role};
#else
  (void)tb; (void)cta; (void)role; (void)start_ns; (void)end_ns; (void)tile;
#endif
}

// A span thread 0 of a CTA opens where it starts something and closes with the
// role it turned out to be (compiled out without KOSMOS_TRACE, like the rest).
struct TraceSpan {
  uint64_t start_ns;
  KOSMOS_HD TraceSpan() : start_ns(trace_now()) {}
  KOSMOS_HD void close(const TraceBuf& tb, int cta, uint8_t role, int32_t tile = -1) const {
    trace_append(tb, cta, role, start_ns, trace_now(), tile);
  }
};

}  // namespace kosmos
