// Host check of the Hopper epilogue's staged-tile addressing (no GPU): the
// hand-written 128-byte swizzle of epilogue.cuh staged_offset against the CuTe
// layout the TMA store descriptors are built from (Cfg::OutTile), and the two
// identities stage_tile and combine_tile rely on. Built by tests/test_sm90_layout.py
// with nvcc (CuTe headers from nvidia-cutlass); prints "ok" or the mismatches.
#include <cstdio>

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
  // stage_tile: column c0 + 8g (c0 = 2 * (lane % 4)) at the row's base plus a
  // compile-time-in-g offset, XORed with the row's phase x = r % 8.
  for (int r = 0; r < Cfg::kBM; ++r)
    for (int c0 = 0; c0 < 8; c0 += 2)
      for (int g = 0; g < Cfg::kBN / 8; ++g) {
        const int x = r % 8;
        const long got = sm90::staged_offset<Cfg, true>(r, c0) + (g / 8) * Cfg::kOutBoxBytes + (((g % 8) ^ x) - x) * 16;
        const long want = sm90::staged_offset<Cfg, true>(r, c0 + 8 * g);
        if (got != want) fail("stage_tile step", r, c0 + 8 * g, want, got);
      }
  return bad;
}

int main() {
  const int bad = check<sm90::TileConfig<gemm::Layout::TN, 128, 256, 3>>("128x256") +
                  check<sm90::TileConfig<gemm::Layout::TN, 128, 192, 4>>("128x192") +
                  check<sm90::TileConfig<gemm::Layout::NN, 128, 128, 5>>("128x128");
  std::printf(bad ? "MISMATCH %d\n" : "ok\n", bad);
  return bad != 0;
}
