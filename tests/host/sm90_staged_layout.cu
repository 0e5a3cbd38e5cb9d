// Host check of the Hopper epilogue's staged-tile addressing (no GPU): the
// hand-written 128-byte swizzle of epilogue.cuh staged_offset against the CuTe
// layout the TMA store descriptors are built from (Cfg::OutTile), and the two
// identities stage_tile and combine_tile rely on (the accumulator fragment's
// order, the stmatrix row addresses; ldmatrix, for a prefetched term, uses the
// same ones; load_boxes places its boxes through staged_offset, so the CuTe
// check covers where a TMA load lands); and the split-B hook's claim that a B
// stage's row halves are RingBHalf stages at its base and half-way (both
// majors), and the SwiGLU staging's that accumulator i + kBN / 4 is column
// c + kBN / 2 of accumulator i's row. Built by tests/test_sm90_layout.py
// with nvcc (CuTe headers from nvidia-cutlass); prints "ok" or the mismatches.
#include <cstdio>
#include <type_traits>

#include "gemm/sm90/epilogue.cuh"

using namespace kosmos;

template <class Cfg>
int check(const char* name) {
  alignas(1024) static uint16_t buf[Cfg::kEpiElems];  // the swizzle acts on address bits: 1024-byte base
  auto t = cute::make_tensor(cute::make_smem_ptr(reinterpret_cast<sm90::bf16*>(buf)), typename Cfg::OutTile{});
  int bad = 0;
  auto fail = [&](const char* what, int r, int c, long want, long got) {
    if (bad++ < 8) std::printf("%s %s: r=%d c=%d want %ld got %ld\n", name, what, r, c, want, got);
  };
  for (int r = 0; r < Cfg::kBM; ++r)
    for (int c = 0; c < Cfg::kBN; ++c) {
      const auto* p = cute::raw_pointer_cast(&t(r, c % Cfg::kOutBoxCols, c / Cfg::kOutBoxCols));
      const long want = reinterpret_cast<const char*>(p) - reinterpret_cast<const char*>(buf);
      const long got = sm90::staged_offset<Cfg, true>(r, c);
      if (want != got) fail("cute layout", r, c, want, got);
      if (sm90::staged_offset<Cfg, false>(r, c) != uint32_t((r * Cfg::kEpiPitch + c) * 2)) fail("pitch", r, c, 0, 1);
      // combine_tile: a thread's vectors 8 rows apart are 1024 bytes apart (same swizzle phase)
      if (r + 8 < Cfg::kBM && sm90::staged_offset<Cfg, true>(r + 8, c) != got + 1024) fail("row step", r, c, 0, 1);
    }
  // stage_tile: the accumulator fragment's order (index i = column pair + 2 *
  // row half + 4 * column group, rows 8 apart, a warp's rows 16 from a
  // multiple of 16) for every consumer thread of the TiledMma.
  typename Cfg::TiledMma mma;
  for (int ctid = 0; ctid < 128 * Cfg::kConsumerWGs; ++ctid) {
    auto coord = mma.get_thread_slice(ctid).partition_C(
        cute::make_identity_tensor(cute::Shape<typename Cfg::BM, typename Cfg::BN>{}));
    const int r0 = cute::get<0>(coord(0)), c0 = cute::get<1>(coord(0)), lane = ctid % 32;
    if (int(cute::size(coord)) != Cfg::kBN / 2 || r0 % 16 != lane / 4 || c0 != 2 * (lane % 4))
      fail("fragment base", r0, c0, lane, ctid);
    for (int i = 0; i < int(cute::size(coord)); ++i) {
      const int r = cute::get<0>(coord(i)), c = cute::get<1>(coord(i));
      if (r != r0 + 8 * ((i >> 1) & 1) || c != c0 + 8 * (i >> 2) + (i & 1)) fail("fragment order", r, c, i, ctid);
      const int j = i + Cfg::kBN / 4;  // moe/swiglu_sm90.cuh: gate column c, up column c + kBN / 2
      if (i < Cfg::kBN / 4 && (cute::get<0>(coord(j)) != r || cute::get<1>(coord(j)) != c + Cfg::kBN / 2))
        fail("up column", r, c, i, ctid);
    }
  }
  // stage_tile's stmatrix rows: lane l of the warp at rows rw, step q, names
  // row rw + l % 16 at column 8 * (2q + l / 16), in either layout.
  auto rows_at = [&](auto boxes) {
    constexpr bool kBoxes = decltype(boxes)::value;
    for (int rw = 0; rw < Cfg::kBM; rw += 16)
      for (int lane = 0; lane < 32; ++lane)
        for (int q = 0; q < Cfg::kBN / 16; ++q) {
          const int r = rw + lane % 16, c = 8 * (2 * q + lane / 16);
          const long got = sm90::stmatrix_offset<Cfg, kBoxes>(sm90::stmatrix_lane_offset<Cfg, kBoxes>(rw, lane), q);
          const long want = sm90::staged_offset<Cfg, kBoxes>(r, c);
          if (got != want) fail(kBoxes ? "stmatrix boxes" : "stmatrix pitch", r, c, want, got);
          if (got % 16 != 0) fail("stmatrix row alignment", r, c, 0, got);
        }
  };
  rows_at(std::true_type{});
  rows_at(std::false_type{});
  return bad;
}

// Byte offset of element (r, k) of stage st in a ring over a 1024-byte-aligned buffer.
template <class Ring>
long ring_offset(int r, int k, int st) {
  alignas(1024) static uint16_t buf[cute::cosize_v<Ring>];
  auto t = cute::make_tensor(cute::make_smem_ptr(reinterpret_cast<sm90::bf16*>(buf)), Ring{});
  return reinterpret_cast<const char*>(cute::raw_pointer_cast(&t(r, k, st))) - reinterpret_cast<const char*>(buf);
}

// The split-B hook (gemm/sm90/tile_config.cuh load_b_halves): element (r, k)
// of B stage st is element (r % (kBN / 2), k) of half-ring stage r / (kBN / 2),
// counted from the B stage's base.
template <class Cfg>
int check_halves(const char* name) {
  using Full = typename Cfg::RingB;
  using Half = typename Cfg::RingBHalf;
  constexpr int kHalf = Cfg::kBN / 2;
  constexpr long kStage = long(Cfg::kBN) * Cfg::kBK * 2;
  int bad = 0;
  if (long(cute::cosize_v<Half>) * 2 * 2 != kStage * Cfg::kStages)  // half-stages of half the bytes
    bad++, std::printf("%s: half ring is %ld bytes, stages %ld\n", name, long(cute::cosize_v<Half>) * 2, kStage);
  for (int st = 0; st < Cfg::kStages; ++st)
    for (int r = 0; r < Cfg::kBN; ++r)
      for (int k = 0; k < Cfg::kBK; ++k) {
        const long want = ring_offset<Full>(r, k, st), got = st * kStage + ring_offset<Half>(r % kHalf, k, r / kHalf);
        if (want != got && bad++ < 8) std::printf("%s half ring: st=%d r=%d k=%d want %ld got %ld\n", name, st, r, k, want, got);
      }
  return bad;
}

int main() {
  const int bad = check<sm90::TileConfig<gemm::Layout::TN, 128, 256, 3>>("128x256") +
                  check<sm90::TileConfig<gemm::Layout::TN, 128, 192, 4>>("128x192") +
                  check<sm90::TileConfig<gemm::Layout::NN, 128, 128, 5>>("128x128") +
                  check_halves<sm90::TileConfig<gemm::Layout::TN, 128, 256, 3>>("TN 128x256") +
                  check_halves<sm90::TileConfig<gemm::Layout::TN, 128, 128, 5>>("TN 128x128") +
                  check_halves<sm90::TileConfig<gemm::Layout::NN, 128, 256, 3>>("NN 128x256") +
                  check_halves<sm90::TileConfig<gemm::Layout::NN, 128, 192, 4>>("NN 128x192");
  std::printf(bad ? "MISMATCH %d\n" : "ok\n", bad);
  return bad != 0;
}
