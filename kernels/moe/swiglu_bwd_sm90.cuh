// The MoE dgrad2's SwiGLU backward as the Hopper engine's staging type
// (gemm/sm90/staging.cuh): a 128x256 tile of da = dY_rows @ W2[e]^T (fp32,
// columns [256 n, + 256) of I) leaves as two bf16 tiles of dh1 [M, 2I], the
// gradients of the forward's gate and up pre-activations at the same columns:
// d(gate) at column 256 n, d(up) at column I + 256 n. The arithmetic is
// moe_swiglu_bwd (moe/swiglu.h), the twin's _swiglu_bwd.
//
// The tile needs the forward's bf16 pre-activations h1 of its rows (gate and
// up, 128 KB) and there is no shared memory left for them beside the ring and
// the staged buffer, so each consumer thread loads the pairs its accumulators
// need straight from global memory (L2: h1 is read once per tile). Two tiles
// leave through one staged buffer: d(gate) is staged and stored here, and its
// copies have read s.c before d(up) is staged over it; the engine then stores
// d(up) through the hooks' store_box. d(up) waits in registers meanwhile (the
// accumulators' own, which it replaces).
//
// Hooks: store_box(t) (d(up)), gate_box(t) (d(gate)), preact_row(t, r) (h1's
// row r of tile t, [2I] bf16: gate then up; nullptr for rows with none, whose
// gradients are zeros) and preact_cols() (I).
#pragma once
#include <type_traits>

#include "gemm/sm90/barrier.cuh"
#include "gemm/sm90/bulk_store.cuh"
#include "gemm/sm90/epilogue.cuh"
#include "gemm/tile_hooks.h"
#include "moe/swiglu.h"

namespace kosmos::moe {

template <class Cfg, class OutT, bool kBoxes, class Hooks>
struct SwigluBwdStaging {
  static_assert(kBoxes, "dh1 leaves by TMA store: hooks with kMapsRows and kStoreBoxes");
  static_assert(std::is_same_v<OutT, gemm::bf16>, "dh1 is bf16");
  static constexpr int kOutCols = Cfg::kBN;
  static constexpr int kAcc = Cfg::kBN / 2;  // accumulators per consumer thread (one 64xBN wgmma fragment)
  using S = sm90::SharedStorage<Cfg>;
  using P = sm90::Params<Cfg>;

  static CUTE_DEVICE void init(S&) {}
  CUTE_DEVICE void after_loads(const P&, S&, gemm::TileCoord, Hooks&) {}
  CUTE_DEVICE auto in_mainloop(const P&, S&, gemm::TileCoord, Hooks&, int) {
    return [](int, int) {};
  }

  // bf16 pair (columns c, c + 1) as two floats.
  static CUTE_DEVICE void unpack(uint32_t v, float* lo, float* hi) {
    *lo = __uint_as_float(v << 16);
    *hi = __uint_as_float(v & 0xffff0000u);
  }

  // Step q of stage_tile's stmatrix order covers accumulators [8q, 8q + 8): the
  // thread's two rows (i / 2 % 2) at column pairs get<1>(coord(i)). Called
  // after the previous tile's stores have read s.c.
  template <class Thr, class Acc, class Phase>
  CUTE_DEVICE void stage(const P&, S& s, gemm::TileCoord t, Hooks& h, int ctid, const Thr& thr, const Acc& acc,
                         const Phase& phase) {
    static_assert(decltype(cute::size(acc))::value == kAcc, "one 64xBN wgmma accumulator per consumer thread");
    auto coord = thr.partition_C(cute::make_identity_tensor(cute::Shape<typename Cfg::BM, typename Cfg::BN>{}));
    const int rw = cute::get<0>(coord(0)) & ~15;  // the warp's first row
    const uint32_t lane_at = sm90::smem_u32(s.c) + sm90::stmatrix_lane_offset<Cfg, true>(rw, int(threadIdx.x % 32));
    const gemm::bf16* const rows[2] = {h.preact_row(t, cute::get<0>(coord(0))), h.preact_row(t, cute::get<0>(coord(2)))};
    const int I = h.preact_cols(), c0 = t.n * Cfg::kBN;
    float du[kAcc];
    CUTE_UNROLL
    for (int q = 0; q < kAcc / 8; ++q) {
      uint32_t gp[4], up[4], r[4];
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) {  // loads first: eight in flight per step
        const int i = 8 * q + 2 * j, c = c0 + cute::get<1>(coord(i));
        const gemm::bf16* row = rows[(i >> 1) & 1];
        const bool in = row != nullptr && c < I;  // columns past I: the next expert's (b_row0), never stored
        gp[j] = in ? __ldg(reinterpret_cast<const uint32_t*>(row + c)) : 0u;
        up[j] = in ? __ldg(reinterpret_cast<const uint32_t*>(row + I + c)) : 0u;
      }
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) {
        const int i = 8 * q + 2 * j;
        float g0, g1, u0, u1, dg0, dg1;
        unpack(gp[j], &g0, &g1);
        unpack(up[j], &u0, &u1);
        moe_swiglu_bwd(acc(i), g0, u0, &dg0, &du[i]);
        moe_swiglu_bwd(acc(i + 1), g1, u1, &dg1, &du[i + 1]);
        r[j] = sm90::pack_bf16x2(dg0, dg1);
      }
      sm90::stmatrix_x4(sm90::stmatrix_offset<Cfg, true>(lane_at, q), r);
    }
    // d(gate) leaves now; its copies must have read s.c before d(up) overwrites
    // it (the engine's own retire does the same between tiles).
    constexpr uint32_t kConsumers = 128 * Cfg::kConsumerWGs;
    sm90::smem_to_async_proxy_fence();
    sm90::named_barrier(sm90::kConsumerBarrier, kConsumers);
    if (ctid == 0) {
      sm90::store_boxes<Cfg>(s, h.gate_box(t));
      sm90::bulk_commit();
      sm90::bulk_wait_reads();
    }
    sm90::named_barrier(sm90::kConsumerBarrier, kConsumers);
    CUTE_UNROLL
    for (int q = 0; q < kAcc / 8; ++q) {
      uint32_t r[4];
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) r[j] = sm90::pack_bf16x2(du[8 * q + 2 * j], du[8 * q + 2 * j + 1]);
      sm90::stmatrix_x4(sm90::stmatrix_offset<Cfg, true>(lane_at, q), r);
    }
    phase(gemm::TilePhase::kStaged);
  }

  CUTE_DEVICE void unstaged(Hooks&, gemm::TileCoord) {}
};

}  // namespace kosmos::moe
