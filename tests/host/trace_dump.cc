// Writes TraceBuf contents through trace_append (kernels/include/kosmos/trace.h)
// to a file, so tests/test_trace.py can check that kosmos_jax/trace.py reads the
// C++ layout. 2 CTAs, cap 3: CTA 0 appends 4 spans (one dropped), CTA 1 two.
// Without -DKOSMOS_TRACE every append is compiled out and the counts stay 0.
// Usage: trace_dump OUT  (OUT gets 2 uint32 counts, then 6 records)
#include <cstdio>
#include <vector>

#include "kosmos/trace.h"

using namespace kosmos;

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  constexpr uint32_t kCap = 3;
  std::vector<TraceRecord> recs(2 * kCap, TraceRecord{0, 0, 0, 0, 0, 0});
  std::vector<uint32_t> count(2, 0);
  const TraceBuf tb{recs.data(), count.data(), kCap, 5};
  for (int i = 0; i < 4; ++i)
    trace_append(tb, 0, (uint8_t)(i % 5), 1000u + 100u * i, 1050u + 100u * i, i == 3 ? -1 : 10 + i);
  trace_append(tb, 1, kTraceReduce, 1010, 1500, 7);
  trace_append(tb, 1, kTraceWait, 1500, 1510);
  const uint64_t t = trace_now();
  (void)t;
  std::FILE* f = std::fopen(argv[1], "wb");
  if (!f) return 1;
  std::fwrite(count.data(), sizeof(uint32_t), count.size(), f);
  std::fwrite(recs.data(), sizeof(TraceRecord), recs.size(), f);
  return std::fclose(f) == 0 ? 0 : 1;
}
