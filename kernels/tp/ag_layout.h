// Where AG+GEMM keeps its state in each device's symmetric heap. Every rank uses
// the same offsets, so a peer's control block is heap[peer] + the same offset.
// The heap is zeroed once at allocation; after that only kernels write these words.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kosmos {

constexpr int kMaxRanks = 8;
constexpr int kMaxTileRows = 4096;  // per shard: 4096 x 128 = 512K local rows

struct AgCtrl {
  uint64_t epoch;          // last epoch this device completed (kernel-advanced)
  uint32_t move_next;      // move queue counter (reset by the last CTA)
  uint32_t build_next;     // build queue counter
  uint32_t finished;       // CTAs done this launch
  uint32_t pad_;
  uint64_t done[kMaxRanks];  // done[p] = last epoch in which peer p finished reading our slot
  uint64_t pub[kMaxTileRows];  // pub[t] = epoch our tile row t was published (peers read it)
  uint64_t arrived[kMaxRanks * kMaxTileRows];  // [src][t]: epoch src's row t landed here
};

constexpr size_t kAgCtrlOffset = 0;
constexpr size_t kHeapDataOffset = 1u << 20;  // gather slots start here, 1 MiB in
static_assert(sizeof(AgCtrl) <= kHeapDataOffset, "AgCtrl must fit below the data region");

inline size_t ag_slot_bytes(size_t rows, size_t k, size_t elem) {
  return (rows * k * elem + 255) / 256 * 256;  // 256-byte aligned slots
}

}  // namespace kosmos
