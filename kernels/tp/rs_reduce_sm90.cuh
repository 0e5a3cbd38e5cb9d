// GEMM+RS's reducers with Hopper builders (tp/gemm_rs_sm90.cuh): a staged
// band of our chunk, summed over ranks in fp32 in rank order and rounded once
// into Y, so the result is bitwise reproducible whichever CTA reduces what.
#pragma once
#include <cstring>
#include <type_traits>

#include <cute/config.hpp>

#include "tp/rs_ops.cuh"

namespace kosmos {

// StageT: the staged partials' type (float or bf16); Tr: the transport
// (kosmos/pull.h, push.h), which says whose staging holds rank src's partial.
template <class StageT, class Tr>
struct RsSm90Reduce {
  // Sums a staged tile over ranks 0..tp-1 in that order (rs_reduce_fixed's
  // order, kVec columns at a time) and rounds once into Y. N % 8 == 0, so a
  // vector of columns is wholly inside or outside the problem. Each thread keeps
  // kGroups 16-byte loads of one rank in flight before it adds them: one load at
  // a time leaves a reducer latency-bound (~17 us per 128 KB tile on H200).
  static constexpr int kGroups = 8;
  static constexpr int kVec = 16 / sizeof(StageT);  // staged elements per 16-byte load
  struct Acc {
    float v[kVec];
  };

  template <class Ops>
  static KOSMOS_DEVICE void reduce(const Ops& ops, const RsSlice& sl) {
    const TraceSpan span;
    const RsParams<bf16_t>& a = ops.p;
    const RsShape& sh = a.shape;
    const int per_row = a.tile_n / kVec, groups = kTileRows * per_row;
    const int step = blockDim.x * kGroups;
    for (int k = sl.k0; k < sl.k0 + sl.n; ++k) {
      const int row0 = (sl.band * sh.R + k / sh.NT) * kTileRows, col0 = (k % sh.NT) * a.tile_n;
      // Rank src's partial of this tile (pull: in src's staging; push: pushed into ours).
      auto partial = [&](int src) {
        const RsStaged h = rs_staged<Tr>(src, a.rank);
        return ops.tile(h.home, rs_stage_slot(sh, sl.band, h.pos, k));
      };
      for (int base = threadIdx.x; base < groups; base += step) {
        Acc acc[kGroups], v[kGroups];
        load_groups(partial(0), base, groups, acc);
        for (int src = 1; src < a.tp; ++src) {
          load_groups(partial(src), base, groups, v);
          CUTE_UNROLL
          for (int u = 0; u < kGroups; ++u)
            CUTE_UNROLL
            for (int e = 0; e < kVec; ++e) acc[u].v[e] += v[u].v[e];
        }
        CUTE_UNROLL
        for (int u = 0; u < kGroups; ++u) {
          const int i = base + u * (int)blockDim.x;
          const int r = i / per_row, c = (i - r * per_row) * kVec;
          if (i < groups && row0 + r < a.rows && col0 + c < a.N)
            store_rounded(a.y + (size_t)(row0 + r) * a.N + col0 + c, acc[u]);
        }
      }
    }
    if (threadIdx.x == 0) span.close(a.trace, blockIdx.x, kTraceReduce, rs_stage_slot(sh, sl.band, a.rank, sl.k0));
  }

  // L2-only 16-byte loads (peers and other CTAs wrote the staging during this
  // launch), widened to fp32.
  static KOSMOS_DEVICE void load_groups(const StageT* tile, int base, int groups, Acc (&v)[kGroups]) {
    uint4 raw[kGroups];
    CUTE_UNROLL
    for (int u = 0; u < kGroups; ++u) {
      const int i = base + u * (int)blockDim.x;
      if (i < groups) raw[u] = __ldcg(reinterpret_cast<const uint4*>(tile) + i);
    }
    CUTE_UNROLL
    for (int u = 0; u < kGroups; ++u) {
      if constexpr (std::is_same_v<StageT, float>) {
        memcpy(v[u].v, &raw[u], 16);
      } else {
        const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw[u]);
        CUTE_UNROLL
        for (int e = 0; e < kVec / 2; ++e) {
          const float2 f = __bfloat1622float2(h[e]);
          v[u].v[2 * e] = f.x, v[u].v[2 * e + 1] = f.y;
        }
      }
    }
  }

  // kVec bf16 outputs, rounded once (8 or 16 bytes, aligned: the column and N
  // are multiples of 8).
  static KOSMOS_DEVICE void store_rounded(bf16_t* out, const Acc& a) {
    uint32_t packed[kVec / 2];
    CUTE_UNROLL
    for (int e = 0; e < kVec / 2; ++e) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(a.v[2 * e], a.v[2 * e + 1]);
      memcpy(&packed[e], &h, 4);
    }
    if constexpr (kVec == 4) {
      *reinterpret_cast<uint2*>(out) = make_uint2(packed[0], packed[1]);
    } else {
      *reinterpret_cast<uint4*>(out) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
  }
};

}  // namespace kosmos
