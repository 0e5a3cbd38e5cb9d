// CTA-cooperative 16-byte copy between GPUs: pull (source is a peer's heap) or
// push (destination is a peer's heap); the code is the same, only the pointers
// differ. Each thread keeps kInFlight 16-byte loads outstanding before storing,
// which is what it takes to fill an NVLink (DESIGN.md §1: 4 loads/thread reach
// ~354 GB/s push, ~361 GB/s pull on H200 NV18).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kosmos/platform.h"

namespace kosmos {

constexpr int kInFlight = 4;

#ifdef KOSMOS_GPU
// L2-only load: data written by another GPU or another CTA must not come from a
// stale L1 line (acquire alone orders, .cg also keeps the line out of L1).
KOSMOS_DEVICE Vec16 load_cg(const Vec16* p) {
#if defined(KOSMOS_CUDA)
  int4 v = __ldcg(reinterpret_cast<const int4*>(p));
  Vec16 out;
  out.w[0] = (unsigned)v.x; out.w[1] = (unsigned)v.y; out.w[2] = (unsigned)v.z; out.w[3] = (unsigned)v.w;
  return out;
#else
  return *p;
#endif
}

// Copies `bytes` from src to dst with all threads of the CTA; with kTwo, each
// vector read is also stored to dst2 when dst2 is not null (one read of a
// peer's row, two landings: the gather slot the builders read and the gathered
// output XLA gets back). All pointers must be 16-byte aligned; a tail that is
// not a whole vector is copied byte by byte. The caller synchronises (barrier +
// release) after it. InFlight (loads each thread issues before its first store)
// is a template knob so the transport benchmark (benchmarks/transport/) can
// sweep it against the default.
template <int InFlight = kInFlight, bool kTwo = false>
KOSMOS_DEVICE void cta_copy16_to(void* dst, void* dst2, const void* src, size_t bytes) {
  const size_t nvec = bytes / kVecBytes;
  auto* d = static_cast<Vec16*>(dst);
  auto* d2 = static_cast<Vec16*>(dst2);
  auto* s = static_cast<const Vec16*>(src);
  const size_t step = (size_t)blockDim.x * InFlight;
  for (size_t base = threadIdx.x; base < nvec; base += step) {
    Vec16 v[InFlight];
#pragma unroll
    for (int u = 0; u < InFlight; ++u) {
      const size_t i = base + (size_t)u * blockDim.x;
      if (i < nvec) v[u] = load_cg(s + i);
    }
#pragma unroll
    for (int u = 0; u < InFlight; ++u) {
      const size_t i = base + (size_t)u * blockDim.x;
      if (i < nvec) {
        d[i] = v[u];
        if (kTwo && d2 != nullptr) d2[i] = v[u];
      }
    }
  }
  auto* db = static_cast<unsigned char*>(dst);
  auto* db2 = static_cast<unsigned char*>(dst2);
  auto* sb = static_cast<const unsigned char*>(src);
  for (size_t i = nvec * kVecBytes + threadIdx.x; i < bytes; i += blockDim.x) {
    db[i] = sb[i];
    if (kTwo && db2 != nullptr) db2[i] = sb[i];
  }
}

template <int InFlight = kInFlight>
KOSMOS_DEVICE void cta_copy16(void* dst, const void* src, size_t bytes) {
  cta_copy16_to<InFlight, false>(dst, nullptr, src, bytes);
}
#endif  // KOSMOS_GPU

}  // namespace kosmos
