// FFI handler kosmos_matmul (CUDA): C = A.B in one of the three row-major
// layouts of ops.matmul (kernels/gemm/tile_problem.h maps them onto the
// engines), on XLA's stream, with grid = min(SMs, cu_cap), one CTA per SM.
// bf16 on a compute-capability-9.0 device runs the Hopper engine (TMA + WGMMA);
// f16/f32, other GPUs, and problems TMA cannot describe run the portable
// engine. Which one ran is counted (matmul_engine_runs), never assumed.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "device.h"
#include "gemm/portable/tile_engine.cuh"
#include "handlers.h"
#include "launch.h"
#include "matmul.h"
#include "matmul_sm90.h"

namespace ffi = xla::ffi;

namespace kosmos {
namespace {

// Launch counters: one per Hopper tile shape (indexed by sm90::TileShape), then
// the portable engine.
constexpr int kPortable = sm90::kTileShapes;
std::atomic<long long> g_runs[sm90::kTileShapes + 1];
template <class T>
cudaError_t portable_launch(gemm::Layout l, const gemm::Problem& p, int grid, cudaStream_t s) {
  using E = portable::TileEngine<gemm::Layout::TN, T, T>;
  const int tiles = gemm::ceil_div(p.M, E::kBM) * gemm::ceil_div(p.N, E::kBN);
  grid = grid < tiles ? grid : tiles;
  if (l == gemm::Layout::TN) portable::portable_gemm<gemm::Layout::TN, T, T><<<grid, E::kThreads, 0, s>>>(p);
  if (l == gemm::Layout::NN) portable::portable_gemm<gemm::Layout::NN, T, T><<<grid, E::kThreads, 0, s>>>(p);
  if (l == gemm::Layout::NT) portable::portable_gemm<gemm::Layout::NT, T, T><<<grid, E::kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t sm90_launch(gemm::Layout l, const sm90::Plan& plan, const gemm::Problem& p, int grid, cudaStream_t s) {
  if (l == gemm::Layout::TN) return sm90_gemm_tn(plan, p, grid, s);
  if (l == gemm::Layout::NN) return sm90_gemm_nn(plan, p, grid, s);
  return sm90_gemm_nt(plan, p, grid, s);
}

// KOSMOS_SM90_TILE=<tile_name>: every kosmos_matmul launch is one launch of
// that Hopper tile shape; =single: choose_tile's one launch, never a head and
// a tail; unset: sm90::plan_gemm's plan (benchmarks compare them; read once).
// -1: not set; -2: a value that is neither.
constexpr int kForcedSingle = sm90::kTileShapes;

int forced_tile() {
  static const int forced = [] {
    const char* v = std::getenv("KOSMOS_SM90_TILE");
    if (v == nullptr || *v == 0) return -1;
    if (std::string(v) == "single") return kForcedSingle;
    for (int t = 0; t < sm90::kTileShapes; ++t)
      if (std::string(v) == sm90::tile_name(static_cast<sm90::TileShape>(t))) return t;
    return -2;
  }();
  return forced;
}

std::string tile_names() {
  std::string s;
  for (int t = 0; t < sm90::kTileShapes; ++t) s += std::string(sm90::tile_name(static_cast<sm90::TileShape>(t))) + ", ";
  return s + "single";
}

sm90::Plan pick_plan(const gemm::Problem& p, int grid, int forced) {
  if (forced == kForcedSingle) return sm90::single(sm90::choose_tile(p.M, p.N, grid), p.M);
  if (forced >= 0) return sm90::single(static_cast<sm90::TileShape>(forced), p.M);
  return sm90::plan_gemm(p.M, p.N, p.K, grid);
}

// Engine problem of the 2-D operands (M, N, K as in tile_problem.h), or why not.
std::string engine_problem(gemm::Layout l, ffi::AnyBuffer a, ffi::AnyBuffer b, gemm::Problem* p) {
  auto ad = a.dimensions(), bd = b.dimensions();
  if (ad.size() != 2 || bd.size() != 2)
    return "operands must be 2-D (ops.matmul folds leading dims), got ranks " + std::to_string(ad.size()) + " and " +
           std::to_string(bd.size());
  int64_t M = ad[0], K = ad[1], N = bd[1], kb = bd[0];  // TN: a [M,K], b [K,N]
  if (l == gemm::Layout::NN) N = bd[0], kb = bd[1];     // NN: a [M,K], b [N,K]
  if (l == gemm::Layout::NT) M = ad[1], K = ad[0];      // NT: a [K,M], b [K,N]
  if (kb != K)
    return "contraction sizes differ: a " + std::to_string(ad[0]) + "x" + std::to_string(ad[1]) + ", b " +
           std::to_string(bd[0]) + "x" + std::to_string(bd[1]);
  if (M <= 0 || N <= 0 || K <= 0 || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
    return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
           " must each be in [1, 2^31)";
  *p = gemm::Problem{a.untyped_data(), b.untyped_data(), nullptr, (int)M, (int)N, (int)K};
  return "";
}

}  // namespace

std::vector<std::pair<std::string, long long>> matmul_engine_runs() {
  std::vector<std::pair<std::string, long long>> out;
  for (int t = 0; t < sm90::kTileShapes; ++t)
    out.emplace_back(std::string("sm90_") + sm90::tile_name(static_cast<sm90::TileShape>(t)), g_runs[t].load());
  out.emplace_back("portable", g_runs[kPortable].load());
  return out;
}

}  // namespace kosmos

using namespace kosmos;

static ffi::Error Fail(const std::string& why) { return ffi::Error::InvalidArgument("kosmos_matmul: " + why); }

static ffi::Error CudaFail(const char* what, int ordinal, cudaError_t e) {
  return ffi::Error::Internal(std::string("kosmos_matmul: ") + what + " on ordinal " + std::to_string(ordinal) +
                              ": " + cudaGetErrorString(e));
}

static ffi::Error MatmulCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer a, ffi::AnyBuffer b,
                             ffi::Result<ffi::AnyBuffer> c, int64_t layout, int64_t cu_cap) {
  if (layout < 0 || layout > 2) return Fail("layout=" + std::to_string(layout) + " must be 0 (TN), 1 (NN) or 2 (NT)");
  const auto l = static_cast<gemm::Layout>(layout);
  const auto dt = a.element_type();
  if (b.element_type() != dt || c->element_type() != dt) return Fail("a, b and c must share one dtype");
  gemm::Problem p;
  if (std::string why = engine_problem(l, a, b, &p); !why.empty()) return Fail(why);
  auto cd = c->dimensions();
  if (cd.size() != 2 || cd[0] != p.M || cd[1] != p.N)
    return Fail("output must be [" + std::to_string(p.M) + ", " + std::to_string(p.N) + "]");
  p.c = c->untyped_data();
  DeviceGuard guard(ordinal);
  if (guard.err != cudaSuccess) return CudaFail("selecting the device", ordinal, guard.err);
  int sms = 0;
  bool is_sm90 = false;
  if (cudaError_t e = device_facts(ordinal, &sms, &is_sm90); e != cudaSuccess) return CudaFail("device query", ordinal, e);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return CudaFail("pending CUDA error", ordinal, e);
  if (poison_output())
    if (cudaError_t e = cudaMemsetAsync(p.c, 0xFF, c->size_bytes(), stream); e != cudaSuccess)
      return CudaFail("poisoning the output", ordinal, e);
  const int grid = (int)(cu_cap > 0 && cu_cap < sms ? cu_cap : sms);
  cudaError_t e = cudaSuccess;
  int ran = kPortable, ran_tail = -1;
  if (dt == ffi::DataType::BF16 && is_sm90 && !sm90::unsupported(p, l)) {
    const int forced = forced_tile();
    if (forced == -2)
      return Fail(std::string("KOSMOS_SM90_TILE=") + std::getenv("KOSMOS_SM90_TILE") +
                  " is not a tile shape; use one of " + tile_names() + " or unset it");
    const sm90::Plan plan = pick_plan(p, grid, forced);
    ran = static_cast<int>(plan.head);
    if (plan.head_rows < p.M) ran_tail = static_cast<int>(plan.tail);
    e = sm90_launch(l, plan, p, grid, stream);
  } else if (dt == ffi::DataType::BF16) {
    e = portable_launch<gemm::bf16>(l, p, grid, stream);
  } else if (dt == ffi::DataType::F16) {
    e = portable_launch<gemm::f16>(l, p, grid, stream);
  } else if (dt == ffi::DataType::F32) {
    e = portable_launch<float>(l, p, grid, stream);
  } else {
    return Fail("dtype must be bf16, f16 or f32");
  }
  if (e != cudaSuccess) return CudaFail(ran == kPortable ? "portable launch" : "sm90 launch", ordinal, e);
  g_runs[ran]++;
  if (ran_tail >= 0) g_runs[ran_tail]++;
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_matmul_cuda, MatmulCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's compute stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // local CUDA ordinal
                                  .Arg<ffi::AnyBuffer>()                     // a: TN/NN [m, k], NT [rows, k]
                                  .Arg<ffi::AnyBuffer>()                     // b: TN [k, n], NN [n, k], NT [rows, n]
                                  .Ret<ffi::AnyBuffer>()                     // c [M, N] in engine terms
                                  .Attr<int64_t>("layout")                   // 0 TN, 1 NN, 2 NT
                                  .Attr<int64_t>("cu_cap"));                 // 0 = all SMs
