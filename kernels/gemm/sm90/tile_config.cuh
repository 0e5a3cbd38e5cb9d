// Tile math of the Hopper engine: tile shape, shared-memory layouts, the
// WGMMA tiling and the TMA descriptors, all as CuTe atoms and layouts (no
// CUTLASS kernel-level classes: the schedule lives in tile_engine.cuh).
//
// Operands are described in the engine's terms (gemm/tile_problem.h): A is
// (M, K) and B is (N, K), each K-major or MN-major. Both majors are native to
// wgmma for 16-bit types, so none of the three layouts needs a transpose pass.
#pragma once
// cute/tensor.hpp first: the atom headers assume what it declares.
#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "gemm/sm90/tile_choice.h"  // unsupported(): which problems TMA can describe
#include "gemm/tile_problem.h"

namespace kosmos::sm90 {

using namespace cute;
using bf16 = cute::bfloat16_t;  // same bits as __nv_bfloat16

template <gemm::Major Mj>
constexpr GMMA::Major kGmmaMajor = Mj == gemm::Major::K ? GMMA::Major::K : GMMA::Major::MN;

// A ring of `Stages` operand tiles of (Rows, BK), each in the canonical
// 128-byte-swizzled wgmma layout of its major: conflict-free for TMA writes
// and wgmma reads. MN-major atoms are 64 rows x 8 k; tiling k first keeps a
// wgmma k-block (16) within neighbouring atoms.
template <gemm::Major Mj, int Rows, int BK, int Stages>
using SmemRing = decltype(tile_to_shape(
    conditional_t<Mj == gemm::Major::K, GMMA::Layout_K_SW128_Atom<bf16>, GMMA::Layout_MN_SW128_Atom<bf16>>{},
    make_shape(Int<Rows>{}, Int<BK>{}, Int<Stages>{}),
    conditional_t<Mj == gemm::Major::K, Step<_1, _2, _3>, Step<_2, _1, _3>>{}));

// SmemRing when a ring of Rows rows is whole swizzle atoms (64 rows MN-major,
// 8 K-major), else void: a configuration names its B half ring (split-B hook)
// even where a half is not whole atoms and no hook can split it.
template <gemm::Major Mj, int Rows, int BK, int Stages,
          bool = Rows % (Mj == gemm::Major::K ? 8 : 64) == 0>
struct RingIfWhole {
  using type = SmemRing<Mj, Rows, BK, Stages>;
};
template <gemm::Major Mj, int Rows, int BK, int Stages>
struct RingIfWhole<Mj, Rows, BK, Stages, false> {
  using type = void;
};

// One engine configuration. Two consumer warp groups split the tile's rows,
// so a 128x256 tile gives each a 64x256 fp32 accumulator (128 registers per
// thread); one producer warp group issues TMA.
//
// SmemEpi: the epilogue stages a 16-bit output tile in shared memory and
// copies it out asynchronously (epilogue.cuh), so the tensor cores start the
// next tile at once. Its buffer (kBM x kEpiPitch) costs one 128x256 operand
// stage: 3 stages + the buffer fill ~211 KB of the 227 KB. Without it the
// consumers store from registers (needed for fp32 outputs: their tile would
// not fit beside the ring).
template <gemm::Layout L, int BM_, int BN_, int Stages_, bool SmemEpi_ = true>
struct TileConfig {
  static constexpr gemm::Layout kLayout = L;
  static constexpr gemm::Major kMajorA = gemm::major_a(L), kMajorB = gemm::major_b(L);
  static constexpr int kBM = BM_, kBN = BN_, kBK = 64, kStages = Stages_;
  static constexpr int kConsumerWGs = 2;
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kConsumerWarps = 4 * kConsumerWGs;
  using BM = Int<kBM>;
  using BN = Int<kBN>;
  using BK = Int<kBK>;
  using RingA = SmemRing<kMajorA, kBM, kBK, kStages>;
  using RingB = SmemRing<kMajorB, kBN, kBK, kStages>;
  // Half a B stage (the split-B hook, gemm/tile_hooks.h b_halves): a stage's
  // row blocks come last in either major (MN-major tiles k first, a K-major
  // atom spans kBK), so rows [0, kBN / 2) of a B stage are its first half of
  // bytes, laid out as a RingBHalf stage, and rows [kBN / 2, kBN) the second
  // (tests/host/sm90_staged_layout.cu checks it against CuTe).
  using RingBHalf = typename RingIfWhole<kMajorB, kBN / 2, kBK, kStages>::type;
  using MmaOp = decltype(GMMA::ss_op_selector<bf16, bf16, float, Shape<Int<kBM / kConsumerWGs>, BN, BK>,
                                              kGmmaMajor<kMajorA>, kGmmaMajor<kMajorB>>());
  using TiledMma = decltype(make_tiled_mma(MmaOp{}, Layout<Shape<Int<kConsumerWGs>, _1, _1>>{}));
  // TMA fills out-of-bounds box elements with zeros and still counts them, so
  // every stage, edge tiles included, lands exactly this many bytes.
  static constexpr uint32_t kStageBytes = (kBM + kBN) * kBK * sizeof(bf16);
  static constexpr bool kSmemEpilogue = SmemEpi_;
  // Row pitch of the staged output tile in 16-bit elements: 16 bytes of
  // padding make a row 16-byte aligned for the bulk copy and put the 8 rows a
  // warp writes at once on disjoint banks (a 2^k-byte pitch would be 8-way).
  static constexpr int kEpiPitch = kBN + 8;
  static constexpr int kEpiElems = kSmemEpilogue ? kBM * kEpiPitch : 8;
  // A tile leaving by TMA store (epilogue.cuh) is staged instead as kBN / 64
  // boxes of [kBM][64] (128 bytes a row), each in the 128-byte-swizzled layout
  // the store reads: a warp's eight rows then also land on disjoint banks, and
  // the tile leaves in kBN / 64 instructions rather than one copy per row.
  static constexpr int kOutBoxCols = 64;
  static constexpr int kOutBoxBytes = kBM * kOutBoxCols * 2;
  using OutTile = SmemRing<gemm::Major::K, kBM, kOutBoxCols, kBN / kOutBoxCols>;  // (kBM, 64, box)
  using OutBox = decltype(OutTile{}(_, _, Int<0>{}));
  static_assert(!kSmemEpilogue || (kBN % kOutBoxCols == 0 && kBN / kOutBoxCols * kOutBoxBytes <= kEpiElems * 2),
                "the swizzled boxes fit the staged buffer");
  static_assert(kBM % (64 * kConsumerWGs) == 0, "each consumer warp group needs whole 64-row wgmma blocks");
};

// The global operand as a (rows, K) tensor; rows is M for A and N for B, and
// ld the stride of its non-contiguous index (row-major JAX storage: the
// contiguous extent, K or rows, unless the operand is a band of a larger one).
template <gemm::Major Mj>
CUTE_HOST_DEVICE auto gmem_operand(const bf16* p, int rows, int k, int ld) {
  if constexpr (Mj == gemm::Major::K)
    return make_tensor(make_gmem_ptr(p), make_shape(rows, k), make_stride(int64_t(ld), _1{}));
  else
    return make_tensor(make_gmem_ptr(p), make_shape(rows, k), make_stride(_1{}, int64_t(ld)));
}

template <gemm::Major Mj, class Ring>
auto make_operand_tma(const bf16* p, int rows, int k, int ld) {
  return make_tma_copy(SM90_TMA_LOAD{}, gmem_operand<Mj>(p, rows, k, ld), Ring{}(_, _, Int<0>{}));
}

// TMA store of staged output boxes (Cfg::OutBox) into a row-major bf16 [rows, cols]
// matrix with leading dimension ld; boxes past its edge are clipped by TMA.
template <class Cfg>
auto make_output_tma(void* p, int rows, int cols, int ld) {
  Tensor g = make_tensor(make_gmem_ptr(static_cast<bf16*>(p)), make_shape(rows, cols), make_stride(int64_t(ld), _1{}));
  return make_tma_copy(SM90_TMA_STORE{}, g, typename Cfg::OutBox{});
}

// Params::TmaBHalf: void where the configuration has no half ring.
template <class Cfg, class Ring = typename Cfg::RingBHalf>
struct HalfTma {
  using type = decltype(make_operand_tma<Cfg::kMajorB, Ring>(nullptr, 1, 1, 1));
};
template <class Cfg>
struct HalfTma<Cfg, void> {
  using type = void;
};

// Kernel parameters: passed as a __grid_constant__ so the TMA descriptors stay
// in parameter space, where TMA may read them. tma_c (bf16 C, the staged
// epilogue): the standalone GEMM's way out; fused kernels whose hooks map rows
// leave it unset and name their own (gemm/tile_hooks.h store_box).
template <class Cfg>
struct Params {
  using TmaA = decltype(make_operand_tma<Cfg::kMajorA, typename Cfg::RingA>(nullptr, 1, 1, 1));
  using TmaB = decltype(make_operand_tma<Cfg::kMajorB, typename Cfg::RingB>(nullptr, 1, 1, 1));
  using TmaC = decltype(make_output_tma<Cfg>(nullptr, 1, 1, 1));
  using TmaBHalf = typename HalfTma<Cfg>::type;  // the split-B hook's box: kBN / 2 rows of B, in hooks' own parameters
  TmaA tma_a;
  TmaB tma_b;
  TmaC tma_c;
  void* c;
  int M, N, K;
};

template <class Cfg>
Params<Cfg> make_params(const gemm::Problem& p) {
  const auto* a = static_cast<const bf16*>(p.a);
  const auto* b = static_cast<const bf16*>(p.b);
  const int lda = gemm::leading_dim_a(Cfg::kLayout, p);
  const int ldb = Cfg::kMajorB == gemm::Major::K ? p.K : p.N;
  Params<Cfg> q{make_operand_tma<Cfg::kMajorA, typename Cfg::RingA>(a, p.M, p.K, lda),
                make_operand_tma<Cfg::kMajorB, typename Cfg::RingB>(b, p.N, p.K, ldb),
                {}, p.c, p.M, p.N, p.K};
  // The staged epilogue stores bf16 C by TMA when N % 8 == 0 (epilogue.cuh
  // smem_epilogue); a fused kernel passes no C.
  if (Cfg::kSmemEpilogue && p.c != nullptr && p.N % 8 == 0) q.tma_c = make_output_tma<Cfg>(p.c, p.M, p.N, p.N);
  return q;
}

// Shared memory of one CTA. The rings need 1024-byte alignment (the swizzle
// pattern repeats every 8 rows of 128 bytes); the kernel aligns the base.
template <class Cfg>
struct SharedStorage {
  alignas(1024) uint16_t a[cosize_v<typename Cfg::RingA>];
  alignas(1024) uint16_t b[cosize_v<typename Cfg::RingB>];
  // staged output tile (SmemEpi): [kBM][kEpiPitch], or kBN / 64 swizzled boxes
  // (Cfg::OutBox), whose 128-byte swizzle repeats every 1024 bytes
  alignas(1024) uint16_t c[Cfg::kEpiElems];
  uint64_t full[Cfg::kStages];   // stage landed (TMA transaction bytes)
  uint64_t empty[Cfg::kStages];  // stage free again (every consumer warp done reading)
  uint64_t claim_full[2];        // claim slot written by the producer
  uint64_t claim_empty[2];       // claim slot read by every consumer warp
  gemm::TileCoord claim[2];
  int claim_valid[2];
  uint64_t done_full[2];   // a retired tile posted for the publisher (kTileDone hooks)
  uint64_t done_empty[2];  // its slot read by the publisher
  gemm::TileCoord done[2];
  int done_valid[2];
  uint32_t done_posts;     // posts so far (consumer thread 0 only: kept here, not in its registers)
  uint64_t c_free;         // c no longer read by the previous tile's stores (the fold's staging, tp/rs_fold_sm90.cuh)
  uint64_t c_ready;        // the producer's offer for this tile done (and its term landed in c)
  int c_loaded;            // the offer: whether the term was loaded into c
  uint32_t c_offers;       // offers so far (loading thread only)

  CUTE_DEVICE bf16* sa() { return reinterpret_cast<bf16*>(a); }
  CUTE_DEVICE bf16* sb() { return reinterpret_cast<bf16*>(b); }
  static constexpr size_t kLaunchBytes = sizeof(SharedStorage) + 1024;  // + base alignment slack
};

// The loading thread, for the split-B hook (gemm/tile_hooks.h b_halves):
// k-block kb of B's half-blocks lo and hi (kBN / 2 rows each, B seen as p's
// (N, K) through `tma`, a Params::TmaBHalf) into rows [0, kBN / 2) and
// [kBN / 2, kBN) of B stage `slot`, both completing on its full barrier: the
// stage's halves are RingBHalf's stages 0 and 1 from its base (Cfg::RingBHalf).
template <class Cfg, class TmaBH>
CUTE_DEVICE void load_b_halves(const TmaBH& tma, const Params<Cfg>& p, SharedStorage<Cfg>& s, int slot, int lo, int hi,
                               int kb) {
  static_assert(Cfg::kStages >= 2, "a stage's two halves are two stages of the half ring");
  Tensor g = local_tile(tma.get_tma_tensor(make_shape(p.N, p.K)), Shape<Int<Cfg::kBN / 2>, typename Cfg::BK>{},
                        make_coord(_, _));  // (kBN / 2, kBK, half-block, k-block)
  Tensor sh = make_tensor(make_smem_ptr(s.sb() + slot * (Cfg::kBN * Cfg::kBK)), typename Cfg::RingBHalf{});
  auto [tg, ts] = tma_partition(tma, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sh), group_modes<0, 2>(g));
  copy(tma.with(s.full[slot]), tg(_, lo, kb), ts(_, 0));
  copy(tma.with(s.full[slot]), tg(_, hi, kb), ts(_, 1));
}

// The CTA's SharedStorage in dynamic shared memory `raw` (kLaunchBytes long),
// its base rounded up to the 1024 bytes the swizzled rings need.
// Dynamic shared memory one sm_90 CTA may opt into (227 KB), less a little for
// the fused kernels' own static shared state.
constexpr size_t kSmemOptIn = 227 * 1024;
constexpr size_t kSmemStaticReserve = 256;

template <class Cfg>
CUTE_DEVICE SharedStorage<Cfg>& shared_storage(char* raw) {
  static_assert(SharedStorage<Cfg>::kLaunchBytes + kSmemStaticReserve <= kSmemOptIn,
                "ring stages + staged output tile exceed the 227 KB of shared memory: fewer stages");
  const auto base = (reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023);
  return *reinterpret_cast<SharedStorage<Cfg>*>(base);
}

}  // namespace kosmos::sm90
