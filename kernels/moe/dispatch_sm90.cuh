// The Hopper movers' dispatch at EP = 1: a part's token rows gathered into
// their arena rows through shared memory with bulk copies (cp.async.bulk),
// issued by one thread. A warp copying 16-byte vectors keeps about 48 KB of
// loads in flight per SM and moved ~24 GB/s per SM under the GEMMs' traffic
// (benchmarks/RESULTS.md, MoE); bulk copies keep a whole half of the engine's
// shared memory in flight, and the other threads stay idle. Movers run no
// engine while they dispatch, so its rings and staging are free for this.
#pragma once
#include <cstdint>

#include "gemm/sm90/barrier.cuh"
#include "gemm/sm90/bulk_store.cuh"
#include "moe/fwd_ctl.cuh"

namespace kosmos::moe {

constexpr int kBulkMaxRows = 16;  // rows per half-buffer batch (the order reads of a batch are in flight together)

// Thread 0's: two mbarriers, one per half of the buffer, and the parity each
// one's next wait expects (bit h).
struct MoeBulkBars {
  uint64_t bar[2];
  uint32_t parity;
};

KOSMOS_DEVICE void moe_bulk_init(MoeBulkBars* b) {
  if (threadIdx.x != 0) return;
  sm90::mbar_init(&b->bar[0], 1);
  sm90::mbar_init(&b->bar[1], 1);
  sm90::mbar_init_fence();
  b->parity = 0;
}

// Thread 0: rows [begin, end) of the packed plan order from `order` (pairs),
// token rows of x into arena rows at + r, in batches of `per` rows through
// alternate halves of `buf`: batch i + 1 loads while batch i stores. Returns
// once every store has landed and is ordered before this thread's later
// generic accesses (the release that publishes the part: bulk_wait_writes).
KOSMOS_DEVICE void moe_bulk_rows(const MoeFwdParams& p, const int* order, int begin, int end, int at, char* buf,
                                 uint32_t half_bytes, MoeBulkBars* b) {
  const uint32_t bytes = (uint32_t)p.H * 2;
  const int k = p.s.top_k, per_fit = (int)(half_bytes / bytes);
  const int per = per_fit < kBulkMaxRows ? per_fit : kBulkMaxRows;
  const int batches = (end - begin + per - 1) / per;
  auto load = [&](int i) {
    const int h = i & 1, r0 = begin + i * per, rows = end - r0 < per ? end - r0 : per;
    int q[kBulkMaxRows];
#pragma unroll
    for (int j = 0; j < kBulkMaxRows; ++j)
      if (j < rows) q[j] = order[r0 + j];
    sm90::mbar_arrive_expect_tx(&b->bar[h], (uint32_t)rows * bytes);
    for (int j = 0; j < rows; ++j)
      sm90::bulk_load(buf + h * half_bytes + j * bytes, p.x + (size_t)(q[j] / k) * p.H, bytes, &b->bar[h]);
  };
  if (batches > 0) load(0);
  for (int i = 0; i < batches; ++i) {
    const int h = i & 1, r0 = begin + i * per, rows = end - r0 < per ? end - r0 : per;
    if (i + 1 < batches) {
      sm90::bulk_wait_reads();  // the other half's stores (batch i - 1) have read it
      load(i + 1);
    }
    sm90::mbar_wait(&b->bar[h], (b->parity >> h) & 1u, "moe dispatch rows");
    b->parity ^= 1u << h;
    for (int j = 0; j < rows; ++j)
      sm90::bulk_store(p.arena + (size_t)(at + r0 + j) * p.H, buf + h * half_bytes + j * bytes, bytes);
    sm90::bulk_commit();
  }
  sm90::bulk_wait_writes();
}

}  // namespace kosmos::moe
