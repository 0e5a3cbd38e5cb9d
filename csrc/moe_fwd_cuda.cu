// FFI handler of the MoE forward (CUDA): kosmos_moe_forward, the forward
// megakernel at EP = 1 with the shared expert (routing runs in XLA before it,
// kosmos_jax/ops/_fused_moe.py). The expert GEMMs alone (the benchmark's
// floor) are csrc/grouped_cuda.cu's. The forward runs its Hopper builders
// (kernels/moe/fwd_sm90.cuh) on compute capability 9.0 and its portable ones
// (kernels/moe/fwd_portable.cuh) on every other GPU, or everywhere with
// KOSMOS_FUSED_BUILDERS=portable: one schedule and workspace, each engine's
// own tile widths; which ran is counted (moe_forward_engine_runs), never
// assumed.
#include <cuda_runtime.h>

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "device.h"
#include "ffi_util.h"
#include "handlers.h"
#include "launch.h"
#include "gemm/tile_order.h"
#include "moe/fwd_ws.h"
#include "moe_fwd_portable.h"
#include "moe_fwd_sm90.h"
#include "trace_buf.h"

namespace ffi = xla::ffi;

using namespace kosmos;
using namespace kosmos::ffi_util;

namespace {

std::atomic<long long> g_runs[2];  // kosmos_moe_forward launches: [0] Hopper builders, [1] portable

// The Hopper builders on compute capability 9.0 unless KOSMOS_FUSED_BUILDERS=portable.
bool hopper_builders(bool sm90) { return sm90 && !force_portable_builders(); }

// "" when the engine runs this shape, else why not, naming the values.
std::string engine_refuses(bool sm90, int64_t H, int64_t I, int64_t E, int64_t k) {
  const std::string why = sm90 ? moe_fwd_sm90_unsupported((int)H, (int)I, (int)E, (int)k)
                               : moe_fwd_portable_unsupported((int)H, (int)I, (int)E, (int)k);
  if (why.empty()) return why;
  return why + " (h=" + std::to_string(H) + ", I=" + std::to_string(I) + ", E=" + std::to_string(E) +
         ", k=" + std::to_string(k) + "; " + (sm90 ? "Hopper" : "portable") + " builders)";
}

// One call's sizes, the engine's column blocks and rows, the grid and the knobs.
struct MoeCall {
  int64_t t, H, k, E, I;
  int R, S, nt1, nt2, grid;  // arena rows, the shared expert's rows (0: none)
  int band;                  // row blocks per band of the tile order (gemm::swizzle_group)
  bool input_gating, switching;
  int64_t movers;
};

// The launch's parameters over the workspace at `base` (laid out by L): the
// shape with the engine's column blocks (nt1, nt2), every pointer, the knobs.
moe::MoeFwdParams moe_params(const MoeCall& c, const moe::MoeWs& L, char* base, const void* x, const void* indices,
                             const void* weights, void* y, void* y_rows, void* pair_row, void* hs) {
  moe::MoeFwdParams m{};
  m.s = moe::MoeFwdShape{1, 0, (int)c.t, (int)c.k, moe::kMoeBlockTokens, (int)c.E, moe::kMoeTileRows, c.nt1, c.nt2,
                         /*groups=*/4, /*capacity=*/(int)c.t, /*shared_rb0=*/c.R / moe::kMoeTileRows,
                         /*shared_blocks=*/c.S / moe::kMoeTileRows, /*band=*/c.band};
  m.H = (int)c.H, m.I = (int)c.I;
  m.x = static_cast<const bf16_t*>(x);
  m.indices = static_cast<const int*>(indices);
  m.weights = static_cast<const float*>(weights);
  m.y = static_cast<bf16_t*>(y);
  m.pair_row = static_cast<int*>(pair_row);
  m.hs = c.S > 0 ? static_cast<bf16_t*>(hs) : nullptr;
  m.input_gating = c.input_gating;
  m.ctrl = reinterpret_cast<moe::MoeCtrl*>(base + L.ctrl);
  m.rbs = (c.R + c.S) / moe::kMoeTileRows;
  m.rb_flags = reinterpret_cast<uint64_t*>(base + L.rb);
  m.rb_counts = reinterpret_cast<uint32_t*>(base + L.rb + (size_t)16 * m.rbs);
  m.hist = reinterpret_cast<int*>(base + L.hist);
  m.order = reinterpret_cast<int*>(base + L.order);
  m.arena = reinterpret_cast<bf16_t*>(base + L.arena);
  m.act = reinterpret_cast<bf16_t*>(base + L.act);
  m.h1 = reinterpret_cast<bf16_t*>(base + L.h1);
  m.y_rows = static_cast<bf16_t*>(y_rows);
  m.movers = moe_movers(c.movers, c.grid, c.switching, 1);
  m.switching = c.switching;
  m.timeout_ns = timeout_ns();
  return m;
}

// The operands' types and shapes (the results' once R is known): "" or what is wrong.
std::string check_operands(ffi::AnyBuffer x, ffi::AnyBuffer indices, ffi::AnyBuffer weights, ffi::AnyBuffer w1,
                           ffi::AnyBuffer w2, ffi::AnyBuffer sw1, ffi::AnyBuffer sw2, int64_t shared) {
  using DT = ffi::DataType;
  auto xd = x.dimensions(), id = indices.dimensions(), w1d = w1.dimensions(), w2d = w2.dimensions();
  if (xd.size() != 2 || id.size() != 2 || w1d.size() != 3 || w2d.size() != 3)
    return "need x [t, h], indices [t, k], w1 [E, h, 2I], w2 [E, I, h]; got " + dims(xd) + ", " + dims(id) + ", " +
           dims(w1d) + ", " + dims(w2d);
  const int64_t t = xd[0], H = xd[1], k = id[1], E = w1d[0], I = w2d[1];
  if (x.element_type() != DT::BF16 || w1.element_type() != DT::BF16 || w2.element_type() != DT::BF16 ||
      sw1.element_type() != DT::BF16 || sw2.element_type() != DT::BF16 || indices.element_type() != DT::S32 ||
      weights.element_type() != DT::F32)
    return "x, w1, w2, sw1, sw2 must be bf16, indices int32, weights float32";
  if (id[0] != t || !shaped(weights.dimensions(), {t, k}) || !shaped(w1d, {E, H, 2 * I}) || !shaped(w2d, {E, I, H}))
    return "shapes disagree: x " + dims(xd) + ", indices " + dims(id) + ", weights " + dims(weights.dimensions()) +
           ", w1 " + dims(w1d) + ", w2 " + dims(w2d);
  if (shared && (!shaped(sw1.dimensions(), {H, 2 * I}) || !shaped(sw2.dimensions(), {I, H})))
    return "the shared expert's sw1 " + dims(sw1.dimensions()) + " and sw2 " + dims(sw2.dimensions()) +
           " must be [h, 2I] and [I, h] with h=" + std::to_string(H) + ", I=" + std::to_string(I) +
           " (as wide as a routed expert)";
  if (t < 1 || t > (1 << 24)) return "t=" + std::to_string(t) + " must be in [1, 2^24]";
  return "";
}

}  // namespace

std::vector<std::pair<std::string, long long>> kosmos::moe_forward_engine_runs() { return engine_counts(g_runs); }

static ffi::Error MoeForwardCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x, ffi::AnyBuffer indices,
                                 ffi::AnyBuffer weights, ffi::AnyBuffer w1, ffi::AnyBuffer w2, ffi::AnyBuffer sw1,
                                 ffi::AnyBuffer sw2, ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> y_rows,
                                 ffi::Result<ffi::AnyBuffer> pair_row, ffi::Result<ffi::AnyBuffer> hs,
                                 ffi::Result<ffi::AnyBuffer> ws, int64_t input_gating, int64_t shared, int64_t cu_cap,
                                 int64_t movers, int64_t switching) {
  const char* op = "kosmos_moe_forward";
  if (std::string why = check_operands(x, indices, weights, w1, w2, sw1, sw2, shared); !why.empty()) return Fail(op, why);
  MoeCall c{x.dimensions()[0], x.dimensions()[1], indices.dimensions()[1], w1.dimensions()[0], w2.dimensions()[1]};
  c.input_gating = input_gating != 0, c.switching = switching != 0, c.movers = movers;
  bool cc90 = false;
  if (std::string why = grid_of(ordinal, cu_cap, &c.grid, &cc90); !why.empty()) return Fail(op, why);
  const bool sm90 = hopper_builders(cc90);
  if (std::string why = engine_refuses(sm90, c.H, c.I, c.E, c.k); !why.empty()) return Fail(op, why);
  if (sm90) moe_fwd_sm90_columns((int)c.H, (int)c.I, &c.nt1, &c.nt2);
  else moe_fwd_portable_columns((int)c.H, (int)c.I, &c.nt1, &c.nt2);
  // The floor's band for the grid: each tile is 128 rows by (H / nt2) columns.
  c.band = gemm::swizzle_group(1 << 20, c.grid, moe::kMoeTileRows, (int)((c.H + c.nt2 - 1) / c.nt2));
  c.R = moe::moe_ep1_rows((int)c.t, (int)c.k, (int)c.E);
  c.S = moe::moe_shared_rows((int)c.t, shared != 0);
  if (std::string why = moe_shared_top_k(shared != 0, c.k); !why.empty()) return Fail(op, why);
  const moe::MoeWs L = moe::moe_ws_layout((int)c.t, (int)c.k, (int)c.E, (int)c.H, (int)c.I, shared != 0);
  if (!shaped(y->dimensions(), {c.t, c.H}) || !shaped(y_rows->dimensions(), {c.R + c.S, c.H}) ||
      !shaped(pair_row->dimensions(), {c.t, c.k}) || (shared && !shaped(hs->dimensions(), {c.t, 2 * c.I})))
    return Fail(op, "results must be y [t, h], y_rows [" + std::to_string(c.R + c.S) + ", h], pair_row [t, k]" +
                        (shared ? ", hs [t, 2I]" : ""));
  if (ws->size_bytes() < L.total)
    return Fail(op, "workspace of " + std::to_string(ws->size_bytes()) + " bytes; it must hold " +
                        std::to_string(L.total) + " (kosmos_jax.ops._fused_moe.workspace_bytes)");
  if (!c.switching && c.grid < 2)
    return Fail(op, "switching=False needs at least 2 CTAs (a mover and a builder); got a grid of " + std::to_string(c.grid));
  DeviceGuard guard(ordinal);
  if (guard.err != cudaSuccess) return CudaFail(op, "selecting the device", ordinal, guard.err);
  const std::string err =
      prepare_builders(sm90, ordinal, moe_fwd_portable_prepare, moe_fwd_sm90_prepare, moe_fwd_sm90_ready);
  char* base = static_cast<char*>(ws->untyped_data());
  cudaError_t e = err.empty() ? cudaMemsetAsync(base, 0, L.zeroed, stream) : cudaSuccess;
  if (e == cudaSuccess && err.empty() && poison_output()) {
    e = cudaMemsetAsync(y->untyped_data(), 0xFF, y->size_bytes(), stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(y_rows->untyped_data(), 0xFF, y_rows->size_bytes(), stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(pair_row->untyped_data(), 0xFF, pair_row->size_bytes(), stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(hs->untyped_data(), 0xFF, hs->size_bytes(), stream);
  }
  if (e == cudaSuccess && err.empty()) {
    moe::MoeFwdParams m = moe_params(c, L, base, x.untyped_data(), indices.untyped_data(), weights.untyped_data(),
                                     y->untyped_data(), y_rows->untyped_data(), pair_row->untyped_data(),
                                     hs->untyped_data());
    m.trace = trace_buf(ordinal, 0);
    e = sm90 ? moe_fwd_sm90_launch(m, w1.untyped_data(), w2.untyped_data(), sw1.untyped_data(), sw2.untyped_data(),
                                   c.grid, stream)
             : moe_fwd_portable_launch(m, w1.untyped_data(), w2.untyped_data(), sw1.untyped_data(),
                                       sw2.untyped_data(), c.grid, ordinal, stream);
    if (e == cudaSuccess) ++g_runs[sm90 ? 0 : 1];  // counted once the launch is accepted
  }
  if (!err.empty()) return ffi::Error::Internal(std::string(op) + ": " + err);
  if (e != cudaSuccess) return CudaFail(op, "launch", ordinal, e);
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_moe_forward_cuda, MoeForwardCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()   // x [t, h] bf16
                                  .Arg<ffi::AnyBuffer>()   // indices [t, k] int32
                                  .Arg<ffi::AnyBuffer>()   // weights [t, k] f32
                                  .Arg<ffi::AnyBuffer>()   // w1 [E, h, 2I] bf16 (gate | up)
                                  .Arg<ffi::AnyBuffer>()   // w2 [E, I, h] bf16
                                  .Arg<ffi::AnyBuffer>()   // sw1 [h, 2I] bf16 (shared), else (1,)
                                  .Arg<ffi::AnyBuffer>()   // sw2 [I, h] bf16 (shared), else (1,)
                                  .Ret<ffi::AnyBuffer>()   // y [t, h] bf16
                                  .Ret<ffi::AnyBuffer>()   // y_rows [R + S, h] bf16
                                  .Ret<ffi::AnyBuffer>()   // pair_row [t, k] int32
                                  .Ret<ffi::AnyBuffer>()   // hs [t, 2I] bf16 (shared), else (1,)
                                  .Ret<ffi::AnyBuffer>()   // ws uint8 (moe/fwd_ws.h)
                                  .Attr<int64_t>("input_gating")
                                  .Attr<int64_t>("shared")
                                  .Attr<int64_t>("cu_cap")      // 0 = all SMs
                                  .Attr<int64_t>("movers")      // -1 = default policy
                                  .Attr<int64_t>("switching"));  // 0: fixed crew
