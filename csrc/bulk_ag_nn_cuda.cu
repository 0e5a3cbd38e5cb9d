// FFI handler kosmos_bulk_ag_nn (CUDA): xg = allgather_rows(x) beside dxp = dy @ w.T
// in one persistent launch (kernels/tp/bulk_ag.cuh). bf16 on a compute-capability-9.0
// device builds dxp with the Hopper engine (bulk_ag_nn_sm90.h); other dtypes and
// devices, and KOSMOS_FUSED_BUILDERS=portable, with the portable one. Which ran is
// counted (bulk_ag_nn_engine_runs), never assumed.
#include <cuda_runtime.h>

#include <atomic>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bulk_ag_nn_sm90.h"
#include "fused_run.h"
#include "handlers.h"
#include "launch.h"
#include "runtime.h"
#include "trace_buf.h"
#include "tp/bulk_ag.cuh"

namespace ffi = xla::ffi;

namespace kosmos {

static PersistentKernels g_kernels{{reinterpret_cast<const void*>(&bulk_ag_nn_kernel<float>),
                                    reinterpret_cast<const void*>(&bulk_ag_nn_kernel<half_t>),
                                    reinterpret_cast<const void*>(&bulk_ag_nn_kernel<bf16_t>)},
                                   sizeof(AgShared), {}};

static std::atomic<long long> g_runs[2];  // launches: [0] Hopper builders, [1] portable

std::string bulk_ag_nn_prepare(int ordinal) {
  std::string err = prepare_all(&g_kernels, ordinal);
  return err.empty() ? bulk_ag_nn_sm90_prepare(ordinal) : err;
}

std::vector<std::pair<std::string, long long>> bulk_ag_nn_engine_runs() { return engine_counts(g_runs); }

namespace {

constexpr int kBulkSwizzle = 8;  // dxp's build bands, as AG+GEMM's (kAgSwizzle)

std::string check(const BulkAgArgs& a, size_t es, const GroupInfo& g, size_t slot) {
  const std::string op = "kosmos_bulk_ag_nn";
  const int64_t M = a.tp * a.rows;
  if (a.xg_bytes != (size_t)(M * a.K) * es || a.dx_bytes != (size_t)(M * a.K) * es)
    return op + ": outputs have " + std::to_string(a.xg_bytes) + " and " + std::to_string(a.dx_bytes) +
           " bytes, want " + std::to_string(M * a.K * es) + " each";
  if ((a.K * es) % kVecBytes)
    return op + ": x rows of k=" + std::to_string(a.K) + " elements (" + std::to_string(a.K * es) +
           " bytes) must be a multiple of 16 bytes";
  if (reinterpret_cast<uintptr_t>(a.x) % kVecBytes) return op + ": x is not 16-byte aligned";
  const int64_t tile_rows = (a.rows + kTileRows - 1) / kTileRows;
  if (tile_rows > kMaxTileRows || kHeapDataOffset + a.tp * slot > g.heap_bytes)
    return op + ": " + std::to_string(a.rows) + " local rows x k=" + std::to_string(a.K) + " need " +
           std::to_string((kHeapDataOffset + a.tp * slot + (1u << 20) - 1) >> 20) + " MiB of heap (have " +
           std::to_string(g.heap_bytes >> 20) + " MiB; set KOSMOS_HEAP_MB or kosmos_jax.runtime.init(heap_mb=...) "
           "before the first kosmos op) and at most " + std::to_string(kMaxTileRows * kTileRows) + " rows";
  return "";
}

// Movers: at least one per rank when there are peers (builders never move), and
// with a fixed split at least one builder besides.
int movers_for(const BulkAgArgs& a, int grid, std::string* err) {
  int mv = a.movers < 0 ? default_movers(grid, (int)a.tp) : (int)(a.movers > grid ? grid : a.movers);
  if (a.tp > 1 && mv < 1) mv = 1;
  if (!a.switching) {
    if (a.tp > 1 && grid < 2)
      *err = "kosmos_bulk_ag_nn: switching=False needs at least 2 CTAs (a mover and a builder); got a grid of " +
             std::to_string(grid);
    if (mv > grid - 1) mv = grid - 1;
  }
  return mv;
}

// xg under KOSMOS_POISON_OUTPUT, and with no peers (nothing moved) x itself.
cudaError_t prepare_gathered(cudaStream_t stream, const BulkAgArgs& a, size_t es) {
  if (poison_output()) {
    const cudaError_t e = cudaMemsetAsync(a.xg, 0xFF, a.xg_bytes, stream);
    if (e != cudaSuccess) return e;
  }
  if (a.tp > 1) return cudaSuccess;
  return cudaMemcpyAsync(a.xg, a.x, (size_t)a.rows * a.K * es, cudaMemcpyDeviceToDevice, stream);
}

}  // namespace

ffi::Error bulk_ag_nn_run(cudaStream_t stream, int ordinal, const GroupInfo& g, int ctrl_slot, const BulkAgArgs& a) {
  const size_t es = ffi::ByteWidth(a.dtype);
  const int dt = dtype_index(a.dtype);
  if (dt < 0) return ffi::Error::InvalidArgument("kosmos_bulk_ag_nn: dtype must be f32, f16 or bf16");
  const size_t slot = ag_slot_bytes(a.rows, a.K, es);
  if (std::string e = check(a, es, g, slot); !e.empty()) return ffi::Error::InvalidArgument(e);
  const bool sm90 = hopper_builders_apply(dt, bulk_ag_nn_sm90_ready(ordinal), a.K, a.N, a.dy, a.w, a.dx);
  const int grid = fused_grid(a.cu_cap, g);
  std::string err;
  const int mv = movers_for(a, grid, &err);
  if (!err.empty()) return ffi::Error::InvalidArgument(err);
  if (cudaError_t e = prepare_gathered(stream, a, es); e != cudaSuccess)
    return ffi::Error::Internal(std::string("kosmos_bulk_ag_nn: gathered output: ") + cudaGetErrorString(e));
  const bool direct = a.tp > 1 && peers_read_directly(g, a.x);
  auto params = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    BulkAgParams<T> q{};
    AgParams<T>& p = q.ag;
    p.x = static_cast<const T*>(a.x);
    p.g_out = static_cast<T*>(a.xg);
    for (int r = 0; r < a.tp; ++r) p.heap[r] = g.heaps[r];
    p.rank = g.rank; p.tp = (int)a.tp; p.m_local = (int)a.m_local; p.rows = (int)a.rows; p.K = (int)a.K;
    p.shape = AgShape{(int)a.tp, g.rank, (int)((a.rows + kTileRows - 1) / kTileRows), 1, 1};
    p.movers = mv; p.switching = a.switching != 0;
    p.ctrl_off = ag_ctrl_offset(ctrl_slot); p.slot_bytes = slot; p.timeout_ns = timeout_ns();
    p.trace = trace_buf(ordinal, g.rank, g.trace_list);
    p.direct = direct;
    q.dy = static_cast<const T*>(a.dy);
    q.w = static_cast<const T*>(a.w);
    q.dx = static_cast<T*>(a.dx);
    q.M = (int)(a.tp * a.rows); q.n = (int)a.N; q.k = (int)a.K;
    q.group = sm90 ? kBulkSwizzle : 1;
    return q;
  };
  return launch_fused(FusedLaunch{"kosmos_bulk_ag_nn", stream, ordinal, grid, dt, sm90, a.dx, a.dx_bytes},
                      g_kernels, g_runs, params, &bulk_ag_nn_sm90_launch);
}

}  // namespace kosmos

using namespace kosmos;

static ffi::Error BulkAgNnCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x, ffi::AnyBuffer dy,
                               ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> xg, ffi::Result<ffi::AnyBuffer> dx,
                               ffi::Span<const int64_t> groups, int64_t tp, ffi::Span<const int64_t> slots,
                               int64_t cu_cap, int64_t movers, int64_t switching) {
  GroupInfo g;
  int ctrl_slot = -1;
  if (auto err = find_group_slot("kosmos_bulk_ag_nn", ordinal, groups, tp, slots, &g, &ctrl_slot); !err.empty())
    return ffi::Error::InvalidArgument(err);
  auto xd = x.dimensions(), dd = dy.dimensions(), wd = w.dimensions();
  if (xd.size() < 2 || dd.size() < 2 || wd.size() != 2 || xd.back() != wd[0] || dd.back() != wd[1])
    return ffi::Error::InvalidArgument("kosmos_bulk_ag_nn: need x [..., m_local, k], dy [..., m, n] and w [k, n]");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < xd.size(); ++i) rows *= xd[i];
  const BulkAgArgs a{x.untyped_data(), dy.untyped_data(), w.untyped_data(), xg->untyped_data(),
                     dx->untyped_data(), xg->size_bytes(), dx->size_bytes(), x.element_type(),
                     rows, xd[xd.size() - 2], xd.back(), wd[1], tp, cu_cap, movers, switching};
  return bulk_ag_nn_run(stream, ordinal, g, ctrl_slot, a);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_bulk_ag_nn_cuda, BulkAgNnCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's compute stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // local CUDA ordinal
                                  .Arg<ffi::AnyBuffer>()                     // x [..., m_local, k]
                                  .Arg<ffi::AnyBuffer>()                     // dy [..., tp*m_local, n]
                                  .Arg<ffi::AnyBuffer>()                     // w [k, n]
                                  .Ret<ffi::AnyBuffer>()                     // xg [..., tp*m_local, k]
                                  .Ret<ffi::AnyBuffer>()                     // dx [..., tp*m_local, k]
                                  .Attr<ffi::Span<const int64_t>>("groups")  // [n_groups*tp] global ids
                                  .Attr<int64_t>("tp")                       // group size
                                  .Attr<ffi::Span<const int64_t>>("slots")   // [n_groups] control slots
                                  .Attr<int64_t>("cu_cap")                   // 0 = all SMs
                                  .Attr<int64_t>("movers")                   // -1 = default policy
                                  .Attr<int64_t>("switching"));              // 0: fixed split
