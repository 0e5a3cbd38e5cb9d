// FFI handlers kosmos_ag_tn and kosmos_ag_nn (CUDA): Y = allgather_rows(X) @ W
// (ag_tn) or dX = allgather_rows(dY) @ w.T with the gathered dY (ag_nn) over the
// symmetric heap. Reads XLA's stream and device ordinal, finds this device's rank in its
// group (static attribute of global device ids), and launches one persistent
// kernel with grid = min(SMs, cu_cap), one CTA per SM (checked by occupancy).
// bf16 on a compute-capability-9.0 device runs the Hopper builders
// (ag_tn_sm90.h); other dtypes, devices and TMA-unfriendly shapes run the
// portable builders, as does KOSMOS_FUSED_BUILDERS=portable. Both are the same
// fused kernel design; which ran is counted (ag_tn_engine_runs), never assumed.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ag_tn_sm90.h"
#include "fused_run.h"
#include "handlers.h"
#include "launch.h"
#include "runtime.h"
#include "trace_buf.h"
#include "tp/ag_gemm.cuh"

namespace ffi = xla::ffi;

namespace kosmos {

// Loaded eagerly and padded to one CTA per SM by runtime init (launch.h): never
// a lazy module load while a persistent kernel spins.
static PersistentKernels g_kernels{{reinterpret_cast<const void*>(&ag_tn_kernel<float>),
                                    reinterpret_cast<const void*>(&ag_tn_kernel<half_t>),
                                    reinterpret_cast<const void*>(&ag_tn_kernel<bf16_t>)},
                                   sizeof(AgShared), {}};
static PersistentKernels g_nn_kernels{{reinterpret_cast<const void*>(&ag_nn_kernel<float>),
                                       reinterpret_cast<const void*>(&ag_nn_kernel<half_t>),
                                       reinterpret_cast<const void*>(&ag_nn_kernel<bf16_t>)},
                                      sizeof(AgShared), {}};

static std::atomic<long long> g_runs[2][2];  // [ag_tn, ag_nn] launches: [0] Hopper builders, [1] portable

std::string ag_tn_prepare(int ordinal) {
  std::string err = prepare_all(&g_kernels, ordinal);
  if (err.empty()) err = prepare_all(&g_nn_kernels, ordinal);
  return err.empty() ? ag_tn_sm90_prepare(ordinal) : err;
}

std::vector<std::pair<std::string, long long>> ag_tn_engine_runs() { return engine_counts(g_runs[0]); }
std::vector<std::pair<std::string, long long>> ag_nn_engine_runs() { return engine_counts(g_runs[1]); }


// 8 tile rows per build band: 8 x 128 rows of A plus a band of W columns stay
// in L2 across a wave. (ops.matmul now uses gemm::swizzle_group's rule, 16 for
// 128x256 on 132 SMs; the fused kernel's bands also set when rows become
// ready, so it keeps 8 until measured there.)
constexpr int kAgSwizzle = 8;

namespace {

// ag_nn's gathered dY (g_out): poisoned like y under KOSMOS_POISON_OUTPUT; with
// no peers nothing is moved, so it is dY itself, copied on the stream.
cudaError_t prepare_gathered(cudaStream_t stream, const AgArgs& a, size_t es) {
  if (a.g_out == nullptr) return cudaSuccess;
  if (poison_output()) {
    const cudaError_t e = cudaMemsetAsync(a.g_out, 0xFF, a.g_bytes, stream);
    if (e != cudaSuccess) return e;
  }
  if (a.tp > 1) return cudaSuccess;
  return cudaMemcpyAsync(a.g_out, a.x, (size_t)a.rows * a.K * es, cudaMemcpyDeviceToDevice, stream);
}

// The checks kosmos_ag_nn adds: pull only, the gathered output's size, and
// 16-byte rows (each batch's run of gathered rows starts a vector copy).
std::string check_nn(const char* op, const AgArgs& a, size_t es) {
  if (!a.nn) return "";
  if (a.transport != Transport::kPull)
    return std::string(op) + ": transport='" + transport_name(a.transport) +
           "' is not supported; the only name here is 'pull' (ag_nn gathers by pull)";
  if (a.g_out == nullptr || a.g_bytes != (size_t)(a.rows * a.tp * a.K) * es)
    return std::string(op) + ": gathered output has " + std::to_string(a.g_bytes) + " bytes, want " +
           std::to_string(a.rows * a.tp * a.K * es);
  if ((a.K * es) % kVecBytes)
    return std::string(op) + ": dy rows of n=" + std::to_string(a.K) + " elements (" + std::to_string(a.K * es) +
           " bytes) must be a multiple of 16 bytes";
  return "";
}

}  // namespace

ffi::Error ag_tn_run(cudaStream_t stream, int ordinal, const GroupInfo& g, int ctrl_slot, const AgArgs& a) {
  const char* op = a.nn ? "kosmos_ag_nn" : "kosmos_ag_tn";
  const std::string name = op;
  const int64_t rows = a.rows, m_local = a.m_local, K = a.K, N = a.N, tp = a.tp;
  const size_t es = ffi::ByteWidth(a.dtype);
  const int dt = dtype_index(a.dtype);
  if (dt < 0) return ffi::Error::InvalidArgument(name + ": dtype must be f32, f16 or bf16");
  if (std::string e = check_nn(op, a, es); !e.empty()) return ffi::Error::InvalidArgument(e);
  if (a.transport == Transport::kPushFold)  // GEMM+RS's; the handler refuses it, the loopback hook reaches here
    return ffi::Error::InvalidArgument(name + ": transport='push_fold' is not supported; the names here are "
                                       "'pull' and 'push' (push_fold is GEMM+RS's)");
  const bool push = a.transport == Transport::kPush;
  const bool ready = a.nn ? ag_nn_sm90_ready(ordinal) : ag_tn_sm90_ready(ordinal);
  const bool sm90 = hopper_builders_apply(dt, ready, K, N, a.x, a.w, a.y);
  if (push && tp > 1 && !sm90)
    return ffi::Error::InvalidArgument(
        name + ": transport='push' needs the Hopper builders (bf16 on a compute-capability-9.0 GPU, "
        "16-byte aligned operands, k and n multiples of 8, KOSMOS_FUSED_BUILDERS unset); these inputs run the "
        "portable builders, which support transport='pull' only");
  const int64_t tile_rows = (rows + kTileRows - 1) / kTileRows;
  // The Hopper builders read every shard as whole 128-row tiles of one matrix.
  const size_t slot = ag_slot_bytes(sm90 ? tile_rows * kTileRows : rows, K, es);
  const int tile_n = sm90 ? ag_tn_sm90_tile_n() : portable::kBN;
  if (a.y_bytes != (size_t)(rows * tp * N) * es)
    return ffi::Error::InvalidArgument(name + ": output has " + std::to_string(a.y_bytes) + " bytes, want " +
                                       std::to_string(rows * tp * N * es));
  if (tile_rows > kMaxTileRows || kHeapDataOffset + tp * slot > g.heap_bytes)
    return ffi::Error::InvalidArgument(
        name + ": " + std::to_string(rows) + " local rows x " + std::to_string(K) + " need " +
        std::to_string((kHeapDataOffset + tp * slot + (1u << 20) - 1) >> 20) + " MiB of heap (have " +
        std::to_string(g.heap_bytes >> 20) + " MiB; set KOSMOS_HEAP_MB or kosmos_jax.runtime.init(heap_mb=...) "
        "before the first kosmos op) and at most " +
        std::to_string(kMaxTileRows * kTileRows) + " rows");
  if (reinterpret_cast<uintptr_t>(a.x) % kVecBytes)
    return ffi::Error::InvalidArgument(name + ": the gathered input is not 16-byte aligned");
  const int grid = fused_grid(a.cu_cap, g);
  int mv = a.movers < 0 ? default_movers(grid, (int)tp) : (int)(a.movers > grid ? grid : a.movers);
  if (tp > 1 && mv < 1) mv = 1;  // builders never move (tp/ag_sched.h ag_cta)
  if (!a.switching) {  // a fixed split keeps at least one builder (and, with peers, one mover)
    if (grid < 2 && tp > 1)
      return ffi::Error::InvalidArgument(name + ": switching=False needs at least 2 CTAs "
                                         "(a mover and a builder); got a grid of " + std::to_string(grid));
    if (mv > grid - 1) mv = grid - 1;
  }
  if (cudaError_t e = prepare_gathered(stream, a, es); e != cudaSuccess)
    return ffi::Error::Internal(name + ": gathered output: " + cudaGetErrorString(e));
  const bool direct = a.nn && tp > 1 && peers_read_directly(g, a.x);  // ag_tn's peers read our slot
  auto params = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    AgParams<T> p{};
    p.x = static_cast<const T*>(a.x);
    p.w = static_cast<const T*>(a.w);
    p.y = static_cast<T*>(a.y);
    p.g_out = static_cast<T*>(a.g_out);
    for (int r = 0; r < tp; ++r) p.heap[r] = g.heaps[r];
    p.rank = g.rank; p.tp = (int)tp; p.m_local = (int)m_local; p.rows = (int)rows;
    p.K = (int)K; p.N = (int)N;
    p.shape = AgShape{(int)tp, g.rank, (int)tile_rows, (int)((N + tile_n - 1) / tile_n), sm90 ? kAgSwizzle : 1};
    p.movers = mv; p.switching = a.switching != 0;
    p.ctrl_off = ag_ctrl_offset(ctrl_slot); p.slot_bytes = slot; p.timeout_ns = timeout_ns();
    p.trace = trace_buf(ordinal, g.rank, g.trace_list);
    p.direct = direct;
    return p;
  };
  auto hopper = [&](const AgParams<bf16_t>& p, int n, cudaStream_t s) {
    if (a.nn) return ag_nn_sm90_launch(p, n, s);
    // One rank moves nothing: it runs the pull kernel, whatever was asked.
    return push && tp > 1 ? ag_tn_sm90_launch<Push>(p, n, s) : ag_tn_sm90_launch<Pull>(p, n, s);
  };
  return launch_fused(FusedLaunch{op, stream, ordinal, grid, dt, sm90, a.y, a.y_bytes},
                      a.nn ? g_nn_kernels : g_kernels, g_runs[a.nn ? 1 : 0], params, hopper);
}

}  // namespace kosmos

using namespace kosmos;

static ffi::Error AgTnCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x, ffi::AnyBuffer w,
                           ffi::Result<ffi::AnyBuffer> y, ffi::Span<const int64_t> groups, int64_t tp,
                           ffi::Span<const int64_t> slots, int64_t cu_cap, int64_t movers, int64_t switching,
                           std::string_view transport) {
  Transport t;
  if (auto err = parse_transport("kosmos_ag_tn", transport, {Transport::kPull, Transport::kPush}, &t); !err.empty())
    return ffi::Error::InvalidArgument(err);
  GroupInfo g;
  int ctrl_slot = -1;
  if (auto err = find_group_slot("kosmos_ag_tn", ordinal, groups, tp, slots, &g, &ctrl_slot); !err.empty())
    return ffi::Error::InvalidArgument(err);
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() < 2 || wd.size() != 2 || xd.back() != wd[0])
    return ffi::Error::InvalidArgument("kosmos_ag_tn: need x [..., m_local, k] and w [k, n]");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) rows *= xd[i];
  const AgArgs a{x.untyped_data(), w.untyped_data(), y->untyped_data(), y->size_bytes(), x.element_type(),
                 rows, xd[xd.size() - 2], xd.back(), wd[1], tp, cu_cap, movers, switching, t};
  return ag_tn_run(stream, ordinal, g, ctrl_slot, a);
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
                                  .Attr<int64_t>("movers")                   // -1 = default policy
                                  .Attr<int64_t>("switching")                // 0: fixed split
                                  .Attr<std::string_view>("transport"));     // "pull" or "push" (Hopper)

// kosmos_ag_nn: dX = allgather_rows(dY) @ w.T and allgather_rows(dY) itself
// (the row-parallel dgrad, and the gathered dY its weight gradient reads).
static ffi::Error AgNnCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer dy, ffi::AnyBuffer w,
                           ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dy_g,
                           ffi::Span<const int64_t> groups, int64_t tp, ffi::Span<const int64_t> slots, int64_t cu_cap,
                           int64_t movers, int64_t switching) {
  GroupInfo g;
  int ctrl_slot = -1;
  if (auto err = find_group_slot("kosmos_ag_nn", ordinal, groups, tp, slots, &g, &ctrl_slot); !err.empty())
    return ffi::Error::InvalidArgument(err);
  auto dd = dy.dimensions(), wd = w.dimensions();
  if (dd.size() < 2 || wd.size() != 2 || dd.back() != wd[1])
    return ffi::Error::InvalidArgument("kosmos_ag_nn: need dy [..., m_local, n] and w [k, n]");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < dd.size(); ++i) rows *= dd[i];
  AgArgs a{dy.untyped_data(), w.untyped_data(), dx->untyped_data(), dx->size_bytes(), dy.element_type(),
           rows, dd[dd.size() - 2], dd.back(), wd[0], tp, cu_cap, movers, switching, Transport::kPull};
  a.g_out = dy_g->untyped_data();
  a.g_bytes = dy_g->size_bytes();
  return ag_nn_run(stream, ordinal, g, ctrl_slot, a);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_ag_nn_cuda, AgNnCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's compute stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // local CUDA ordinal
                                  .Arg<ffi::AnyBuffer>()                     // dy [..., m_local, n]
                                  .Arg<ffi::AnyBuffer>()                     // w [k, n]
                                  .Ret<ffi::AnyBuffer>()                     // dx [..., tp*m_local, k]
                                  .Ret<ffi::AnyBuffer>()                     // dy_g [..., tp*m_local, n]
                                  .Attr<ffi::Span<const int64_t>>("groups")  // [n_groups*tp] global ids
                                  .Attr<int64_t>("tp")                       // group size
                                  .Attr<ffi::Span<const int64_t>>("slots")   // [n_groups] control slots
                                  .Attr<int64_t>("cu_cap")                   // 0 = all SMs
                                  .Attr<int64_t>("movers")                   // -1 = default policy
                                  .Attr<int64_t>("switching"));              // 0: fixed split
