// Which problems the Hopper engine takes, and which tile shape to use for one
// (a closed-form wave model). Plain C++ (no CuTe) so the host launcher, an FFI
// handler and CPU tests share it.
//
// A persistent grid runs ceil(tiles / SMs) waves; a wave of 128x128 tiles
// does half the work of a wave of 128x256 tiles and, measured on H200
// (2026-11-30, benchmarks/gemm_standalone), runs at ~0.94x its efficiency.
// Narrow N (few tiles per wave) therefore favours 128x128; large problems,
// whose last wave is a small fraction, favour 128x256.
#pragma once
#include "gemm/tile_problem.h"

namespace kosmos::sm90 {

enum class TileShape : int { k128x256 = 0, k128x128 = 1 };

constexpr double kSmallTilePenalty = 1.06;  // time of two 128x128 waves / one 128x256 wave

inline TileShape choose_tile(int M, int N, int sms) {
  const long waves_big = gemm::ceil_div(gemm::ceil_div(M, 128) * gemm::ceil_div(N, 256), sms);
  const long waves_small = gemm::ceil_div(gemm::ceil_div(M, 128) * gemm::ceil_div(N, 128), sms);
  return waves_small * kSmallTilePenalty < 2.0 * waves_big ? TileShape::k128x128 : TileShape::k128x256;
}

// Why a problem cannot run on this engine, or nullptr. TMA needs 16-byte
// aligned bases and leading dimensions that are multiples of 16 bytes; the
// caller falls back to the portable engine otherwise.
inline const char* unsupported(const gemm::Problem& p, gemm::Layout l) {
  auto misaligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) != 0; };
  if (p.M <= 0 || p.N <= 0 || p.K <= 0) return "empty problem";
  if (misaligned(p.a) || misaligned(p.b) || misaligned(p.c)) return "operand not 16-byte aligned";
  const int lda = gemm::major_a(l) == gemm::Major::K ? p.K : p.M;
  const int ldb = gemm::major_b(l) == gemm::Major::K ? p.K : p.N;
  if (lda % 8 || ldb % 8) return "leading dimension not a multiple of 8 elements";
  return nullptr;
}

}  // namespace kosmos::sm90
