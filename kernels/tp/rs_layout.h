// Where GEMM+RS (paper §3.2.2) keeps its control words in each device's
// symmetric heap. Every rank uses the same offsets, so a peer's word is
// heap[peer] + the same offset. The heap is zeroed once at allocation; after
// that only kernels write these words (epochs, never host resets).
//
// RS control blocks sit in their own table right after AG's (one block per
// group slot, as for AG), so both ops can share a group slot number. The fp32
// staging buffer lives in the data region (kHeapDataOffset), laid out by
// rs_stage_slot() in tp/rs_sched.h; HeapUse guards it across ops like AG's slots.
// Bulk RS || NT (tp/bulk_rs.cuh) uses the same control blocks: why that is safe
// is argued there.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kosmos/platform.h"
#include "tp/ag_layout.h"

namespace kosmos {

constexpr int kRsMaxBands = 512;  // bands per chunk: 512 bands of >= 1 tile row each

struct RsCtrl {
  uint64_t epoch;        // last epoch this device completed (advanced by the last CTA)
  uint32_t build_next;   // GEMM tile queue counter (local; reset by the last CTA)
  uint32_t reduce_next;  // reduce queue counter (local; reset by the last CTA)
  uint32_t finished;     // CTAs done this launch
  uint32_t move_next;    // bulk RS || NT's push queue counter (tp/bulk_rs_sched.h; tn_rs leaves it 0)
  // Bulk RS || NT: where the peers read our partials this epoch. src_ptr, set
  // before src_epoch is released, is dx_partial itself, which every peer of the
  // group (all in this process) reads directly, or 0: we push them into the
  // peers' staging (tp/bulk_rs.cuh announce_ready).
  uint64_t src_epoch;
  uint64_t src_ptr;
  // done[p] = last epoch in which peer p finished reading our staging buffer.
  uint64_t done[kMaxRanks];
  // ready[p] = last epoch in which peer p's staging took our pushes (Push, PushFold).
  uint64_t ready[kMaxRanks];
  // step_claimed[b] = epoch in which every tile of step b (band b of every chunk)
  // was claimed here. Peers read it before waiting on our bands, so a cross-rank
  // wait on pub[] is always on claimed work. Epoch-valued: never reset.
  uint64_t step_claimed[kRsMaxBands];
  // pub[b * kMaxRanks + c] = epoch in which band b of chunk c landed in our staging
  // (push: c is the rank that wrote band b of our chunk; rs_staged()).
  uint64_t pub[kRsMaxBands * kMaxRanks];
  // Tiles of (b, c) written this launch; the builder that completes the band
  // publishes it. Local only (never read by peers), so the last CTA may reset it.
  uint32_t band_count[kRsMaxBands * kMaxRanks];
};

constexpr size_t kRsCtrlStride = (sizeof(RsCtrl) + 4095) / 4096 * 4096;
constexpr size_t kRsCtrlTableOffset = kCtrlTableOffset + (size_t)kCtrlSlots * kCtrlStride;
static_assert(kRsCtrlTableOffset + (size_t)kCtrlSlots * kRsCtrlStride <= kHeapDataOffset,
              "the RS control table must fit below the data region");

KOSMOS_HD constexpr size_t rs_ctrl_offset(int slot) { return kRsCtrlTableOffset + (size_t)slot * kRsCtrlStride; }

KOSMOS_HD constexpr int rs_flag_index(int band, int chunk) { return band * kMaxRanks + chunk; }

}  // namespace kosmos
