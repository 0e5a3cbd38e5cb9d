// FFI handler kosmos_ag_tn (CUDA): Y = allgather_rows(X) @ W over the symmetric
// heap. Reads XLA's stream and device ordinal, finds this device's rank in its
// group (static attribute of global device ids), and launches one persistent
// kernel with grid = min(SMs, cu_cap), one CTA per SM (checked by occupancy).
#include <cuda_runtime.h>

#include <cstdlib>
#include <type_traits>
#include <string>

#include "handlers.h"
#include "launch.h"
#include "runtime.h"
#include "tp/ag_gemm.cuh"

namespace ffi = xla::ffi;

namespace kosmos {

template <typename T>
static std::string prepare_one(int ordinal, int* dyn_smem) {
  // Forces the module load now (never lazily while a persistent kernel spins) and
  // pads shared memory so that exactly one CTA fits per SM.
  return prepare_persistent(reinterpret_cast<const void*>(&ag_tn_kernel<T>), portable::kThreads,
                            sizeof(AgShared), ordinal, dyn_smem);
}

static int g_dyn_smem[3][64];  // [dtype][ordinal], set by prepare

std::string ag_tn_prepare(int ordinal) {
  if (ordinal < 0 || ordinal >= 64) return "device ordinal out of range";
  std::string err = prepare_one<float>(ordinal, &g_dyn_smem[0][ordinal]);
  if (err.empty()) err = prepare_one<half_t>(ordinal, &g_dyn_smem[1][ordinal]);
  if (err.empty()) err = prepare_one<bf16_t>(ordinal, &g_dyn_smem[2][ordinal]);
  return err;
}

static uint64_t timeout_ns() {
  static const uint64_t ns = [] {
    const char* s = std::getenv("KOSMOS_TIMEOUT_MS");
    const long long ms = s && *s ? std::atoll(s) : 10000;
    return (uint64_t)(ms > 0 ? ms : 10000) * 1000000ull;
  }();
  return ns;
}

// KOSMOS_POISON_OUTPUT=1 (tests): fill y with NaN bytes first, so an element the
// kernel forgets to write shows up as NaN.
static bool poison_output() {
  static const bool on = [] {
    const char* s = std::getenv("KOSMOS_POISON_OUTPUT");
    return s && *s && std::string(s) != "0";
  }();
  return on;
}

template <typename T>
static ffi::Error launch(cudaStream_t stream, int ordinal, int dyn, int grid, AgParams<T> p, size_t y_bytes) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return ffi::Error::Internal(std::string("kosmos_ag_tn: pending CUDA error ") + cudaGetErrorString(e));
  if (poison_output() && (e = cudaMemsetAsync(p.y, 0xFF, y_bytes, stream)) != cudaSuccess)
    return ffi::Error::Internal(std::string("kosmos_ag_tn: poisoning y failed: ") + cudaGetErrorString(e));
  ag_tn_kernel<T><<<grid, portable::kThreads, dyn, stream>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess)
    return ffi::Error::Internal("kosmos_ag_tn: launch on ordinal " + std::to_string(ordinal) + " failed: " +
                                cudaGetErrorString(e));
  return ffi::Error::Success();
}

}  // namespace kosmos

using namespace kosmos;

static ffi::Error AgTnCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x, ffi::AnyBuffer w,
                           ffi::Result<ffi::AnyBuffer> y, ffi::Span<const int64_t> groups, int64_t tp,
                           ffi::Span<const int64_t> slots, int64_t cu_cap, int64_t movers) {
  GroupInfo g;
  if (auto err = find_group("kosmos_ag_tn", ordinal, groups, tp, &g); !err.empty())
    return ffi::Error::InvalidArgument(err);
  // One control block per group (kernels/tp/ag_layout.h): slots[row] of our group.
  if (tp < 1 || slots.size() * (size_t)tp != groups.size())
    return ffi::Error::InvalidArgument("kosmos_ag_tn: " + std::to_string(slots.size()) + " control slots for " +
                                       std::to_string(groups.size() / (tp > 0 ? tp : 1)) + " groups");
  const int64_t ctrl_slot = slots[g.row];
  if (ctrl_slot < 0 || ctrl_slot >= kCtrlSlots)
    return ffi::Error::InvalidArgument("kosmos_ag_tn: control slot " + std::to_string(ctrl_slot) + " of group row " +
                                       std::to_string(g.row) + " is outside 0.." + std::to_string(kCtrlSlots - 1));
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() < 2 || wd.size() != 2 || xd.back() != wd[0])
    return ffi::Error::InvalidArgument("kosmos_ag_tn: need x [..., m_local, k] and w [k, n]");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) rows *= xd[i];
  const int64_t m_local = xd[xd.size() - 2], K = xd.back(), N = wd[1];
  const size_t es = ffi::ByteWidth(x.element_type());
  const size_t slot = ag_slot_bytes(rows, K, es);
  const int64_t tile_rows = (rows + portable::kBM - 1) / portable::kBM;
  if (y->size_bytes() != (size_t)(rows * tp * N) * es)
    return ffi::Error::InvalidArgument("kosmos_ag_tn: output has " + std::to_string(y->size_bytes()) + " bytes, want " +
                                       std::to_string(rows * tp * N * es));
  if (tile_rows > kMaxTileRows || kHeapDataOffset + tp * slot > g.heap_bytes)
    return ffi::Error::InvalidArgument(
        "kosmos_ag_tn: " + std::to_string(rows) + " local rows x k=" + std::to_string(K) + " need " +
        std::to_string((kHeapDataOffset + tp * slot + (1u << 20) - 1) >> 20) + " MiB of heap (have " +
        std::to_string(g.heap_bytes >> 20) + " MiB; set KOSMOS_HEAP_MB or kosmos_jax.runtime.init(heap_mb=...) "
        "before the first kosmos op) and at most " +
        std::to_string(kMaxTileRows * portable::kBM) + " rows");
  if (reinterpret_cast<uintptr_t>(x.untyped_data()) % kVecBytes)
    return ffi::Error::InvalidArgument("kosmos_ag_tn: x is not 16-byte aligned");
  const int grid = (int)(cu_cap > 0 && cu_cap < g.sm_count ? cu_cap : g.sm_count);
  const int mv = movers < 0 ? default_movers(grid, (int)tp) : (int)(movers > grid ? grid : movers);
  auto fill = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    AgParams<T> p{};
    p.x = static_cast<const T*>(x.untyped_data());
    p.w = static_cast<const T*>(w.untyped_data());
    p.y = static_cast<T*>(y->untyped_data());
    for (int r = 0; r < tp; ++r) p.heap[r] = g.heaps[r];
    p.rank = g.rank; p.tp = (int)tp; p.m_local = (int)m_local; p.rows = (int)rows;
    p.K = (int)K; p.N = (int)N;
    p.shape = AgShape{(int)tp, g.rank, (int)tile_rows, (int)((N + portable::kBN - 1) / portable::kBN)};
    p.movers = mv; p.ctrl_off = ag_ctrl_offset((int)ctrl_slot); p.slot_bytes = slot; p.timeout_ns = timeout_ns();
    return p;
  };
  switch (x.element_type()) {
    case ffi::DataType::F32: return launch(stream, ordinal, g_dyn_smem[0][ordinal], grid, fill((float*)nullptr), y->size_bytes());
    case ffi::DataType::F16: return launch(stream, ordinal, g_dyn_smem[1][ordinal], grid, fill((half_t*)nullptr), y->size_bytes());
    case ffi::DataType::BF16: return launch(stream, ordinal, g_dyn_smem[2][ordinal], grid, fill((bf16_t*)nullptr), y->size_bytes());
    default: return ffi::Error::InvalidArgument("kosmos_ag_tn: dtype must be f32, f16 or bf16");
  }
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_ag_tn_cuda, AgTnCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's compute stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // local CUDA ordinal
                                  .Arg<ffi::AnyBuffer>()                     // x [..., m_local, k]
                                  .Arg<ffi::AnyBuffer>()                     // w [k, n]
                                  .Ret<ffi::AnyBuffer>()                     // y [..., tp*m_local, n]
                                  .Attr<ffi::Span<const int64_t>>("groups")  // [n_groups*tp] global ids
                                  .Attr<int64_t>("tp")                       // group size
                                  .Attr<ffi::Span<const int64_t>>("slots")   // [n_groups] control slots
                                  .Attr<int64_t>("cu_cap")                   // 0 = all SMs
                                  .Attr<int64_t>("movers"));                 // -1 = default policy
