// FFI handler kosmos_tn_rs (CUDA): Y = reduce_scatter_rows(X @ W) over the
// symmetric heap, one persistent launch (kernels/tp/gemm_rs.cuh). The kernel is
// 2-D: x [tp * rows, k] whose row chunk c is rank c's share of the output; the
// Python wrapper (kosmos_jax/ops/_fused_tp.py) folds leading batch dims into it.
// Grid = min(SMs, cu_cap), one CTA per SM (checked by occupancy at init).
// bf16 on a compute-capability-9.0 device runs the Hopper builders
// (tn_rs_sm90.h, kernels/tp/gemm_rs_sm90.cuh) when the shape suits TMA; other
// launches, and KOSMOS_FUSED_BUILDERS=portable, run the portable builders. Which
// ran is counted (tn_rs_engine_runs), never assumed.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fused_run.h"
#include "handlers.h"
#include "launch.h"
#include "runtime.h"
#include "trace_buf.h"
#include "tn_rs_sm90.h"
#include "tp/gemm_rs.cuh"

namespace ffi = xla::ffi;

namespace kosmos {

static PersistentKernels g_kernels{{reinterpret_cast<const void*>(&tn_rs_kernel<float>),
                                    reinterpret_cast<const void*>(&tn_rs_kernel<half_t>),
                                    reinterpret_cast<const void*>(&tn_rs_kernel<bf16_t>)},
                                   sizeof(RsShared), {}};

static std::atomic<long long> g_runs[2];  // launches: [0] Hopper builders, [1] portable

std::string tn_rs_prepare(int ordinal) {
  std::string err = prepare_all(&g_kernels, ordinal);
  return err.empty() ? tn_rs_sm90_prepare(ordinal) : err;
}

std::vector<std::pair<std::string, long long>> tn_rs_engine_runs() { return engine_counts(g_runs); }


// Band height: one tile row per band (the finest pipelining) unless the chunk
// has more tile rows than the control block has band flags, or `band_rows`
// (RsConfig.band_rows, Hopper builders only) asks for taller bands. Why taller:
// with one-row bands the ~132 tiles in flight span 132 / NT tile rows, so at
// NT = 64 (N = 16384) every second tile row streams all of W from DRAM again
// (~28 GB for 405B-Down-MBS4, where fused ran 1.68x our GEMM alone); 8-row bands
// built column by column keep ~8 rows x 16 columns in flight. They start the
// reduction later, so the ops layer asks for them only where W outgrows L2
// (kosmos_jax/kernel_config.py rs_band_rows, measured on 2xH200). Reduce items
// are single tiles (reducers balance at tile grain).
static RsShape rs_shape(int tp, int rank, int64_t rows, int64_t N, int tile_n, int band_rows) {
  const int T = (int)((rows + kTileRows - 1) / kTileRows);
  const int NT = (int)((N + tile_n - 1) / tile_n);
  const int R = std::max((T + kRsMaxBands - 1) / kRsMaxBands, std::min(band_rows, T));
  return RsShape{tp, rank, T, NT, R, 1};
}

// Fold: steps by which a rank's own band trails its peers' (tp/rs_sched.h).
// Band b of a peer is published about two grids of tiles after its claim (the
// tiles in flight, then the engine's one-tile-late tile_done); a step claims
// tp * R * NT tiles on every rank, so a lag of 2 * grid / (tp * R * NT) steps,
// plus one, finds it published while its partials are a few MB old (in L2).
// KOSMOS_RS_FOLD_LAG (read once) overrides it, for measurements.
static int rs_fold_lag(const RsShape& s, int grid) {
  static const int forced = [] {
    const char* v = std::getenv("KOSMOS_RS_FOLD_LAG");
    return v && *v ? std::atoi(v) : -1;
  }();
  const int per_step = s.tp * s.R * s.NT, bands = rs_bands(s);
  const int lag = forced >= 0 ? forced : (2 * grid + per_step - 1) / per_step + 1;
  return std::min(lag, bands);
}

// "" or why the heap cannot hold this call's staging (rounded up to whole MiB).
static std::string heap_check(const RsShape& s, int tile_n, int elem, int64_t rows, int64_t N, size_t heap_bytes) {
  const size_t need = kHeapDataOffset + rs_stage_bytes(s, tile_n, elem);
  if (need <= heap_bytes) return "";
  return "kosmos_tn_rs: " + std::to_string(s.tp) + " x " + std::to_string(rows) + " rows x n=" + std::to_string(N) +
         " need " + std::to_string((need + (1u << 20) - 1) >> 20) + " MiB of heap for the " +
         (elem == 2 ? "bf16" : "fp32") + " staging (have " +
         std::to_string(heap_bytes >> 20) +
         " MiB; set KOSMOS_HEAP_MB or kosmos_jax.runtime.init(heap_mb=...) before the first kosmos op)";
}

ffi::Error tn_rs_run(cudaStream_t stream, int ordinal, const GroupInfo& g, int ctrl_slot, const RsArgs& a) {
  const int64_t rows = a.rows, K = a.K, N = a.N, tp = a.tp;
  const size_t es = ffi::ByteWidth(a.dtype);
  if (a.y_bytes != (size_t)(rows * N) * es)
    return ffi::Error::InvalidArgument("kosmos_tn_rs: output has " + std::to_string(a.y_bytes) +
                                       " bytes, want " + std::to_string(rows * N * es));
  const int dt = dtype_index(a.dtype);
  if (dt < 0) return ffi::Error::InvalidArgument("kosmos_tn_rs: dtype must be f32, f16 or bf16");
  if (rows == 0 || N == 0) return ffi::Error::Success();  // every rank skips alike: epochs stay in step
  // Hopper builders also need chunks of whole 128-row tiles: a TMA tile of x
  // never straddles two ranks' chunks.
  const bool sm90 = rows % kTileRows == 0 && hopper_builders_apply(dt, tn_rs_sm90_ready(ordinal), K, N,
                                                                       a.x, a.w, a.y);
  const int tile_n = sm90 ? tn_rs_sm90_tile_n() : portable::kBN;
  // One rank moves nothing: it runs the pull kernel, whatever was asked.
  const Transport tr = tp > 1 ? a.transport : Transport::kPull;
  if (tr != Transport::kPull && !sm90)
    return ffi::Error::InvalidArgument(
        std::string("kosmos_tn_rs: transport='") + transport_name(a.transport) +
        "' needs the Hopper builders (bf16 on a compute-capability-9.0 GPU, rows per "
        "rank a multiple of 128, 16-byte aligned operands, k and n multiples of 8, KOSMOS_FUSED_BUILDERS unset); "
        "these inputs run the portable builders, which support transport='pull' only");
  if (tr == Transport::kPushFold && (!a.stage_bf16 || !a.switching))
    return ffi::Error::InvalidArgument("kosmos_tn_rs: transport='push_fold' needs stage='bf16' and switching=True "
                                       "(the fold sums in the bf16 staged epilogue and has no reducers to split "
                                       "off); got stage_bf16=" + std::to_string(a.stage_bf16) +
                                       ", switching=" + std::to_string(a.switching));
  // bf16 staging is a Hopper-builder option; the portable builders stage fp32.
  if (a.stage_bf16 && dt != 2)
    return ffi::Error::InvalidArgument("kosmos_tn_rs: bf16 staging needs bf16 inputs");
  const bool bf16_stage = sm90 && a.stage_bf16;
  if (a.band_rows < 1 || a.band_rows > kRsMaxBands)
    return ffi::Error::InvalidArgument("kosmos_tn_rs: band_rows=" + std::to_string(a.band_rows) + " must be in [1, " +
                                       std::to_string(kRsMaxBands) + "]");
  RsShape shape = rs_shape((int)tp, g.rank, rows, N, tile_n, sm90 ? (int)a.band_rows : 1);
  if (auto err = heap_check(shape, tile_n, bf16_stage ? 2 : 4, rows, N, g.heap_bytes); !err.empty())
    return ffi::Error::InvalidArgument(err);
  const int grid = fused_grid(a.cu_cap, g);
  int red = a.reducers < 0 ? rs_default_reducers(grid, (int)tp) : (int)(a.reducers > grid ? grid : a.reducers);
  if (tr == Transport::kPushFold) red = 0, shape.lag = rs_fold_lag(shape, grid);  // nothing to reduce: every CTA builds
  if (!a.switching) {  // a fixed split needs a reducer and a builder: nobody switches to cover either
    if (grid < 2)
      return ffi::Error::InvalidArgument("kosmos_tn_rs: switching=False needs at least 2 CTAs (a reducer and a "
                                         "builder); got a grid of " + std::to_string(grid));
    red = red < 1 ? 1 : red > grid - 1 ? grid - 1 : red;
  }
  auto params = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    RsParams<T> p{};
    p.x = static_cast<const T*>(a.x);
    p.w = static_cast<const T*>(a.w);
    p.y = static_cast<T*>(a.y);
    for (int r = 0; r < tp; ++r) p.heap[r] = g.heaps[r];
    p.rank = g.rank; p.tp = (int)tp; p.rows = (int)rows; p.K = (int)K; p.N = (int)N; p.tile_n = tile_n;
    p.stage_bf16 = bf16_stage ? 1 : 0;
    p.shape = shape; p.reducers = red; p.switching = a.switching != 0;
    p.ctrl_off = rs_ctrl_offset(ctrl_slot); p.timeout_ns = timeout_ns();
    p.trace = trace_buf(ordinal, g.rank, g.trace_list);
    return p;
  };
  auto hopper = [&](const RsParams<bf16_t>& p, int n, cudaStream_t s) {
    return tr == Transport::kPull   ? tn_rs_sm90_launch<Pull>(p, n, s)
           : tr == Transport::kPush ? tn_rs_sm90_launch<Push>(p, n, s)
                                    : tn_rs_sm90_launch<PushFold>(p, n, s);
  };
  return launch_fused(FusedLaunch{"kosmos_tn_rs", stream, ordinal, grid, dt, sm90, a.y, a.y_bytes}, g_kernels,
                      g_runs, params, hopper);
}

}  // namespace kosmos

using namespace kosmos;

static ffi::Error TnRsCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x, ffi::AnyBuffer w,
                           ffi::Result<ffi::AnyBuffer> y, ffi::Span<const int64_t> groups, int64_t tp,
                           ffi::Span<const int64_t> slots, int64_t cu_cap, int64_t reducers,
                           int64_t stage_bf16, int64_t switching, int64_t band_rows, std::string_view transport) {
  Transport t;
  if (auto err = parse_transport("kosmos_tn_rs", transport, kAllTransports, &t); !err.empty())
    return ffi::Error::InvalidArgument(err);
  GroupInfo g;
  int ctrl_slot = -1;
  if (auto err = find_group_slot("kosmos_tn_rs", ordinal, groups, tp, slots, &g, &ctrl_slot); !err.empty())
    return ffi::Error::InvalidArgument(err);
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0] || xd[0] % tp)
    return ffi::Error::InvalidArgument("kosmos_tn_rs: need x [tp*rows, k] and w [k, n]; got x rank " +
                                       std::to_string(xd.size()) + ", w rank " + std::to_string(wd.size()) +
                                       ", tp=" + std::to_string(tp));
  const RsArgs a{x.untyped_data(), w.untyped_data(), y->untyped_data(), y->size_bytes(), x.element_type(),
                 xd[0] / tp, xd[1], wd[1], tp, cu_cap, reducers, stage_bf16, switching, band_rows, t};
  return tn_rs_run(stream, ordinal, g, ctrl_slot, a);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_tn_rs_cuda, TnRsCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's compute stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // local CUDA ordinal
                                  .Arg<ffi::AnyBuffer>()                     // x [tp*rows, k]
                                  .Arg<ffi::AnyBuffer>()                     // w [k, n]
                                  .Ret<ffi::AnyBuffer>()                     // y [rows, n]
                                  .Attr<ffi::Span<const int64_t>>("groups")  // [n_groups*tp] global ids
                                  .Attr<int64_t>("tp")                       // group size
                                  .Attr<ffi::Span<const int64_t>>("slots")   // [n_groups] control slots
                                  .Attr<int64_t>("cu_cap")                   // 0 = all SMs
                                  .Attr<int64_t>("reducers")                 // -1 = default policy
                                  .Attr<int64_t>("stage_bf16")               // 1: bf16 staging (Hopper builders)
                                  .Attr<int64_t>("switching")                // 0: fixed split
                                  .Attr<int64_t>("band_rows")                // tile rows per band (Hopper builders)
                                  .Attr<std::string_view>("transport"));     // "pull", "push", "push_fold" (Hopper)
