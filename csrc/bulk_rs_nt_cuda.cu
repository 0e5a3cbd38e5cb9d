// FFI handler kosmos_bulk_rs_nt (CUDA): dx = reduce_scatter_rows(dx_partial)
// beside dw = x_gathered^T @ dy in one persistent launch (kernels/tp/bulk_rs.cuh).
// The kernel is 2-D: dx_partial [tp * rows, k] whose row chunk c is rank c's
// share of dx, x_gathered [M, k] and dy [M, n] with M = tp * rows; the Python
// wrapper (kosmos_jax/ops/_fused_bulk_rs.py) folds leading batch dims into them.
// Grid = min(SMs, cu_cap), one CTA per SM (checked by occupancy at init). bf16
// on a compute-capability-9.0 device builds dw with the Hopper engine
// (bulk_rs_nt_sm90.h) when the shape suits TMA; other dtypes and devices, and
// KOSMOS_FUSED_BUILDERS=portable, with the portable one. Which ran is counted
// (bulk_rs_nt_engine_runs), never assumed.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bulk_rs_nt_sm90.h"
#include "fused_run.h"
#include "handlers.h"
#include "launch.h"
#include "runtime.h"
#include "trace_buf.h"
#include "tp/bulk_rs.cuh"

namespace ffi = xla::ffi;

namespace kosmos {

static PersistentKernels g_kernels{{reinterpret_cast<const void*>(&bulk_rs_nt_kernel<float>),
                                    reinterpret_cast<const void*>(&bulk_rs_nt_kernel<half_t>),
                                    reinterpret_cast<const void*>(&bulk_rs_nt_kernel<bf16_t>)},
                                   sizeof(BulkRsShared<float>), {}};
static_assert(sizeof(BulkRsShared<float>) == sizeof(BulkRsShared<bf16_t>), "one static smem size for every dtype");

static std::atomic<long long> g_runs[2];  // launches: [0] Hopper builders, [1] portable

std::string bulk_rs_nt_prepare(int ordinal) {
  std::string err = prepare_all(&g_kernels, ordinal);
  return err.empty() ? bulk_rs_nt_sm90_prepare(ordinal) : err;
}

std::vector<std::pair<std::string, long long>> bulk_rs_nt_engine_runs() { return engine_counts(g_runs); }

namespace {

const char* const kOp = "kosmos_bulk_rs_nt";

// A band (one push: rank c's rows of one band to one owner) of about 1 MiB, at
// least 8 rows, and at most kRsMaxBands bands a chunk (the pub[] flags); a
// reduce item of about 128 KiB of dx (a band in 8 slices), so every CTA that
// joins the reduction finds work.
constexpr size_t kBandBytes = 1u << 20, kSliceBytes = 128u << 10;

BulkRsShape bulk_shape(const BulkRsArgs& a, int rank, size_t es, int tile_n, int builders) {
  const int64_t row_bytes = a.K * (int64_t)es;
  int64_t br = std::max<int64_t>(8, (int64_t)kBandBytes / row_bytes / 8 * 8);
  br = std::min(br, (a.rows + 7) / 8 * 8);                                        // one band at most
  br = std::max(br, ((a.rows + kRsMaxBands - 1) / kRsMaxBands + 7) / 8 * 8);      // enough flags
  const int slices = (int)std::max<int64_t>(1, (br * row_bytes + kSliceBytes - 1) / (int64_t)kSliceBytes);
  const int tm = (int)((a.K + 127) / 128), tn = a.N > 0 ? (int)((a.N + tile_n - 1) / tile_n) : 0;
  return BulkRsShape{(int)a.tp, rank, (int)a.rows, (int)a.K, (int)br, slices, tm, tn,
                     gemm::swizzle_group(tm, std::max(builders, 1), 128, tile_n), 0};
}

std::string check(const BulkRsArgs& a, size_t es, const GroupInfo& g, size_t slot) {
  const std::string op = kOp;
  if (a.dx_bytes != (size_t)(a.rows * a.K) * es || a.dw_bytes != (size_t)(a.K * a.N) * es)
    return op + ": outputs have " + std::to_string(a.dx_bytes) + " and " + std::to_string(a.dw_bytes) +
           " bytes, want " + std::to_string(a.rows * a.K * es) + " (dx) and " + std::to_string(a.K * a.N * es) +
           " (dw)";
  // Band offsets and a band's elements are ints (tp/bulk_rs_sched.h).
  if (a.rows * a.K >= (1ll << 31) || a.tp * a.rows >= (1ll << 31))
    return op + ": " + std::to_string(a.rows) + " rows per chunk x k=" + std::to_string(a.K) +
           " is too large (at most 2^31 elements a chunk)";
  const size_t need = kHeapDataOffset + (size_t)(a.tp - 1) * slot;
  if (a.tp > 1 && need > g.heap_bytes)
    return op + ": " + std::to_string(a.tp) + " x " + std::to_string(a.rows) + " rows x k=" + std::to_string(a.K) +
           " need " + std::to_string((need + (1u << 20) - 1) >> 20) + " MiB of heap for the staging (have " +
           std::to_string(g.heap_bytes >> 20) + " MiB; set KOSMOS_HEAP_MB or kosmos_jax.runtime.init(heap_mb=...) "
           "before the first kosmos op)";
  return "";
}

// Movers: the caller's count or 1 in 8 CTAs, clamped to the grid; a fixed
// split needs a mover (the only CTAs that push and reduce) and a builder.
int movers_for(const BulkRsArgs& a, int grid, std::string* err) {
  int mv = a.movers < 0 ? default_movers(grid, (int)a.tp) : (int)std::min<int64_t>(a.movers, grid);
  if (!a.switching) {
    if (grid < 2)
      *err = std::string(kOp) + ": switching=False needs at least 2 CTAs (a mover and a builder); got a grid of " +
             std::to_string(grid);
    mv = std::max(1, std::min(mv, grid - 1));
  }
  return mv;
}

// Calls with nothing to launch: k == 0 (dx and dw are empty) or no rows (dx is
// empty and dw sums no rows: zeros). Every rank of a group skips alike, so the
// epochs stay in step.
bool empty_call(cudaStream_t stream, const BulkRsArgs& a, cudaError_t* e) {
  if (a.K != 0 && a.rows != 0) return false;
  *e = a.K != 0 && a.dw_bytes ? cudaMemsetAsync(a.dw, 0, a.dw_bytes, stream) : cudaSuccess;
  return true;
}

// Poisons dw under KOSMOS_POISON_OUTPUT (the launch poisons dx).
cudaError_t poison_dw(cudaStream_t stream, const BulkRsArgs& a) {
  return poison_output() && a.dw_bytes ? cudaMemsetAsync(a.dw, 0xFF, a.dw_bytes, stream) : cudaSuccess;
}

template <typename T>
BulkRsParams<T> params_of(const BulkRsArgs& a, const GroupInfo& g, int ordinal, int ctrl_slot, size_t slot,
                          const BulkRsShape& shape, int movers) {
  BulkRsParams<T> p{};
  p.dxp = static_cast<const T*>(a.dxp);
  p.dx = static_cast<T*>(a.dx);
  p.xg = static_cast<const T*>(a.xg);
  p.dy = static_cast<const T*>(a.dy);
  p.dw = static_cast<T*>(a.dw);
  for (int r = 0; r < a.tp; ++r) p.heap[r] = g.heaps[r];
  p.rank = g.rank; p.tp = (int)a.tp; p.M = (int)(a.tp * a.rows); p.k = (int)a.K; p.n = (int)a.N;
  p.shape = shape; p.movers = movers; p.switching = a.switching != 0;
  p.ctrl_off = rs_ctrl_offset(ctrl_slot); p.slot_bytes = slot; p.timeout_ns = timeout_ns();
  p.trace = trace_buf(ordinal, g.rank, g.trace_list);
  return p;
}

}  // namespace

ffi::Error bulk_rs_nt_run(cudaStream_t stream, int ordinal, const GroupInfo& g, int ctrl_slot, const BulkRsArgs& a) {
  const size_t es = ffi::ByteWidth(a.dtype);
  const int dt = dtype_index(a.dtype);
  if (dt < 0) return ffi::Error::InvalidArgument(std::string(kOp) + ": dtype must be f32, f16 or bf16");
  const size_t slot = bulk_slot_bytes(a.rows, a.K, es);
  if (std::string e = check(a, es, g, slot); !e.empty()) return ffi::Error::InvalidArgument(e);
  if (cudaError_t e = cudaSuccess; empty_call(stream, a, &e))
    return e == cudaSuccess ? ffi::Error::Success()
                            : ffi::Error::Internal(std::string(kOp) + ": zeroing dw: " + cudaGetErrorString(e));
  const bool sm90 = a.N > 0 && hopper_builders_apply(dt, bulk_rs_nt_sm90_ready(ordinal), a.K, a.N, a.xg, a.dy, a.dw);
  const int grid = fused_grid(a.cu_cap, g);
  std::string err;
  const int mv = movers_for(a, grid, &err);
  if (!err.empty()) return ffi::Error::InvalidArgument(err);
  const int tile_n = sm90 ? bulk_rs_nt_sm90_tile_n() : 128;  // portable: BulkRsEngine's 128 x 128 tiles
  BulkRsShape shape = bulk_shape(a, g.rank, es, tile_n, grid - (a.switching ? 0 : mv));
  shape.direct = a.tp > 1 && peers_read_directly(g, a.dxp);
  if (cudaError_t e = poison_dw(stream, a); e != cudaSuccess)
    return ffi::Error::Internal(std::string(kOp) + ": poisoning dw: " + cudaGetErrorString(e));
  auto params = [&](auto* tag) {
    return params_of<std::remove_pointer_t<decltype(tag)>>(a, g, ordinal, ctrl_slot, slot, shape, mv);
  };
  return launch_fused(FusedLaunch{kOp, stream, ordinal, grid, dt, sm90, a.dx, a.dx_bytes}, g_kernels, g_runs, params,
                      &bulk_rs_nt_sm90_launch);
}

}  // namespace kosmos

using namespace kosmos;

static ffi::Error BulkRsNtCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer dxp, ffi::AnyBuffer xg,
                               ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dw,
                               ffi::Span<const int64_t> groups, int64_t tp, ffi::Span<const int64_t> slots,
                               int64_t cu_cap, int64_t movers, int64_t switching) {
  GroupInfo g;
  int ctrl_slot = -1;
  if (auto err = find_group_slot(kOp, ordinal, groups, tp, slots, &g, &ctrl_slot); !err.empty())
    return ffi::Error::InvalidArgument(err);
  auto pd = dxp.dimensions(), xd = xg.dimensions(), yd = dy.dimensions();
  if (pd.size() != 2 || xd.size() != 2 || yd.size() != 2 || pd[0] % tp || xd[0] != pd[0] || yd[0] != pd[0] ||
      xd[1] != pd[1])
    return ffi::Error::InvalidArgument(std::string(kOp) + ": need dx_partial [tp*rows, k], x_gathered [tp*rows, k] "
                                       "and dy [tp*rows, n]; got ranks " + std::to_string(pd.size()) + ", " +
                                       std::to_string(xd.size()) + ", " + std::to_string(yd.size()) +
                                       ", tp=" + std::to_string(tp));
  if (xg.element_type() != dxp.element_type() || dy.element_type() != dxp.element_type())
    return ffi::Error::InvalidArgument(std::string(kOp) + ": dx_partial, x_gathered and dy must share a dtype");
  const BulkRsArgs a{dxp.untyped_data(), xg.untyped_data(), dy.untyped_data(), dx->untyped_data(),
                     dw->untyped_data(), dx->size_bytes(), dw->size_bytes(), dxp.element_type(),
                     pd[0] / tp, pd[1], yd[1], tp, cu_cap, movers, switching};
  return bulk_rs_nt_run(stream, ordinal, g, ctrl_slot, a);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_bulk_rs_nt_cuda, BulkRsNtCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's compute stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // local CUDA ordinal
                                  .Arg<ffi::AnyBuffer>()                     // dx_partial [tp*rows, k] rank-major
                                  .Arg<ffi::AnyBuffer>()                     // x_gathered [tp*rows, k]
                                  .Arg<ffi::AnyBuffer>()                     // dy [tp*rows, n]
                                  .Ret<ffi::AnyBuffer>()                     // dx [rows, k]
                                  .Ret<ffi::AnyBuffer>()                     // dw [k, n]
                                  .Attr<ffi::Span<const int64_t>>("groups")  // [n_groups*tp] global ids
                                  .Attr<int64_t>("tp")                       // group size
                                  .Attr<ffi::Span<const int64_t>>("slots")   // [n_groups] control slots
                                  .Attr<int64_t>("cu_cap")                   // 0 = all SMs
                                  .Attr<int64_t>("movers")                   // -1 = default policy
                                  .Attr<int64_t>("switching"));              // 0: fixed split
