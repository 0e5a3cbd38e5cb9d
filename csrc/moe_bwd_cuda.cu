// FFI handler of the MoE backward (CUDA): kosmos_moe_backward, the backward
// megakernel at EP = 1 with the shared expert (contract:
// kosmos_jax/ops/_fused_moe_bwd.py). Its Hopper builders
// (kernels/moe/bwd_sm90.cuh) on compute capability 9.0, its portable ones
// (kernels/moe/bwd_portable.cuh) on every other GPU or everywhere with
// KOSMOS_FUSED_BUILDERS=portable: one schedule and workspace, each engine's
// tile widths; which ran is counted (moe_backward_engine_runs). It reads the
// forward's workspace (the gathered x rows, act and h1 of the same routing,
// kernels/moe/fwd_ws.h).
#include <cuda_runtime.h>

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "device.h"
#include "ffi_util.h"
#include "gemm/tile_order.h"
#include "handlers.h"
#include "launch.h"
#include "moe/bwd_ws.h"
#include "moe_bwd_portable.h"
#include "moe_bwd_sm90.h"
#include "trace_buf.h"

namespace ffi = xla::ffi;

using namespace kosmos;
using namespace kosmos::ffi_util;

namespace {

std::atomic<long long> g_runs[2];  // kosmos_moe_backward launches: [0] Hopper builders, [1] portable

// The operands' types and shapes for the engine (sm90: the Hopper builders): "" or what is wrong.
std::string check_operands(ffi::AnyBuffer dy, ffi::AnyBuffer indices, ffi::AnyBuffer weights, ffi::AnyBuffer w1,
                           ffi::AnyBuffer w2, ffi::AnyBuffer fws, bool sm90) {
  using DT = ffi::DataType;
  auto dd = dy.dimensions(), id = indices.dimensions(), w1d = w1.dimensions(), w2d = w2.dimensions();
  if (dd.size() != 2 || id.size() != 2 || w1d.size() != 3 || w2d.size() != 3 || fws.dimensions().size() != 1)
    return "need dy [t, h], indices [t, k], w1 [E, h, 2I], w2 [E, I, h], fws [W]; got " + dims(dd) + ", " + dims(id) +
           ", " + dims(w1d) + ", " + dims(w2d) + ", " + dims(fws.dimensions());
  const int64_t t = dd[0], H = dd[1], k = id[1], E = w1d[0], I = w2d[1];
  if (dy.element_type() != DT::BF16 || w1.element_type() != DT::BF16 || w2.element_type() != DT::BF16 ||
      indices.element_type() != DT::S32 || weights.element_type() != DT::F32 || fws.element_type() != DT::U8)
    return "dy, w1, w2 must be bf16, indices int32, weights float32, fws uint8";
  if (id[0] != t || !shaped(weights.dimensions(), {t, k}) || !shaped(w1d, {E, H, 2 * I}) || !shaped(w2d, {E, I, H}))
    return "shapes disagree: dy " + dims(dd) + ", indices " + dims(id) + ", weights " + dims(weights.dimensions()) +
           ", w1 " + dims(w1d) + ", w2 " + dims(w2d);
  if (t < 1 || t > (1 << 24)) return "t=" + std::to_string(t) + " must be in [1, 2^24]";
  const std::string why = sm90 ? moe_bwd_sm90_unsupported((int)H, (int)I, (int)E, (int)k)
                               : moe::moe_bwd_portable_unsupported((int)H, (int)I, (int)E, (int)k);
  if (!why.empty())
    return why + " (h=" + std::to_string(H) + ", I=" + std::to_string(I) + ", E=" + std::to_string(E) +
           ", k=" + std::to_string(k) + "; " + (sm90 ? "Hopper" : "portable") + " builders)";
  return "";
}

// The shared expert's operands, when there is one: "" or what is wrong.
std::string check_shared(ffi::AnyBuffer x, ffi::AnyBuffer hs, ffi::AnyBuffer sw1, ffi::AnyBuffer sw2, bool shared,
                         int64_t t, int64_t H, int64_t I, int64_t k) {
  using DT = ffi::DataType;
  if (!shared) return "";
  if (!shaped(x.dimensions(), {t, H}) || !shaped(hs.dimensions(), {t, 2 * I}) ||
      !shaped(sw1.dimensions(), {H, 2 * I}) || !shaped(sw2.dimensions(), {I, H}) || x.element_type() != DT::BF16 ||
      hs.element_type() != DT::BF16 || sw1.element_type() != DT::BF16 || sw2.element_type() != DT::BF16)
    return "the shared expert's x " + dims(x.dimensions()) + ", hs " + dims(hs.dimensions()) + ", sw1 " +
           dims(sw1.dimensions()) + ", sw2 " + dims(sw2.dimensions()) + " must be bf16 [t, h], [t, 2I], [h, 2I], "
           "[I, h] with t=" + std::to_string(t) + ", h=" + std::to_string(H) + ", I=" + std::to_string(I);
  return moe_shared_top_k(shared, k);
}

struct Results {
  ffi::Result<ffi::AnyBuffer> &dx, &dx_rows, &pair_row, &dw1, &dw2, &dsw1, &dsw2, &ws;
};

// The forward's workspace (fws_total bytes at least), the results' shapes and the
// backward's workspace (ws_total): "" or what is wrong.
std::string check_buffers(ffi::AnyBuffer fws, const Results& r, bool shared, size_t fws_total, size_t ws_total,
                          int64_t t, int64_t H, int64_t I, int64_t E, int64_t k, int64_t rows) {
  if (fws.size_bytes() < fws_total)
    return "the forward's workspace fws has " + std::to_string(fws.size_bytes()) + " bytes; the forward of this "
           "shape (shared=" + std::to_string(shared) + ") leaves " + std::to_string(fws_total);
  if (!shaped(r.dx->dimensions(), {t, H}) || !shaped(r.dx_rows->dimensions(), {rows, H}) ||
      !shaped(r.pair_row->dimensions(), {t, k}) || !shaped(r.dw1->dimensions(), {E, H, 2 * I}) ||
      !shaped(r.dw2->dimensions(), {E, I, H}) ||
      (shared && (!shaped(r.dsw1->dimensions(), {H, 2 * I}) || !shaped(r.dsw2->dimensions(), {I, H}))))
    return "results must be dx [t, h], dx_rows [" + std::to_string(rows) + ", h], pair_row [t, k], dw1 "
           "[E, h, 2I], dw2 [E, I, h]" + std::string(shared ? ", dsw1 [h, 2I], dsw2 [I, h]" : "");
  if (r.ws->size_bytes() < ws_total)
    return "workspace of " + std::to_string(r.ws->size_bytes()) + " bytes; it must hold " + std::to_string(ws_total) +
           " (kosmos_jax.ops._fused_moe_bwd.workspace_bytes)";
  return "";
}

// The forward's workspace's sections and the backward's own buffers, for either engine.
struct MoeBwdBuffers {
  const void *w1, *w2, *x_rows, *act, *h1, *x, *hs, *sw1, *sw2;
  void *dh1, *dw1, *dw2, *dsw1, *dsw2;
};

cudaError_t launch_engine(bool sm90, const moe::MoeFwdParams& m, const MoeBwdBuffers& b, int grid, int ordinal,
                          cudaStream_t stream) {
  if (sm90)
    return moe_bwd_sm90_launch(m, b.w1, b.w2, b.x_rows, b.act, b.h1, b.dh1, b.dw1, b.dw2, b.x, b.hs, b.sw1, b.sw2,
                               b.dsw1, b.dsw2, grid, stream);
  using T = bf16_t;
  const moe::MoeBwdPortableParams<T> p{
      m, static_cast<const T*>(b.w1), static_cast<const T*>(b.w2), static_cast<const T*>(b.x_rows),
      static_cast<const T*>(b.act), static_cast<const T*>(b.h1), static_cast<T*>(b.dh1), static_cast<T*>(b.dw1),
      static_cast<T*>(b.dw2), static_cast<const T*>(b.x), static_cast<const T*>(b.hs), static_cast<const T*>(b.sw1),
      static_cast<const T*>(b.sw2), static_cast<T*>(b.dsw1), static_cast<T*>(b.dsw2),
      moe::moe_portable_wgrad_tiles(m.H, m.I)};
  return moe_bwd_portable_launch(p, grid, ordinal, stream);
}

}  // namespace

std::vector<std::pair<std::string, long long>> kosmos::moe_backward_engine_runs() { return engine_counts(g_runs); }

static ffi::Error MoeBackwardCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer dy, ffi::AnyBuffer indices,
                                  ffi::AnyBuffer weights, ffi::AnyBuffer w1, ffi::AnyBuffer w2, ffi::AnyBuffer fws,
                                  ffi::AnyBuffer x, ffi::AnyBuffer hs, ffi::AnyBuffer sw1, ffi::AnyBuffer sw2,
                                  ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dx_rows,
                                  ffi::Result<ffi::AnyBuffer> pair_row, ffi::Result<ffi::AnyBuffer> dw1,
                                  ffi::Result<ffi::AnyBuffer> dw2, ffi::Result<ffi::AnyBuffer> dsw1,
                                  ffi::Result<ffi::AnyBuffer> dsw2, ffi::Result<ffi::AnyBuffer> ws,
                                  int64_t input_gating, int64_t shared, int64_t cu_cap, int64_t movers,
                                  int64_t switching) {
  const char* op = "kosmos_moe_backward";
  int grid = 0;
  bool cc90 = false;
  if (std::string why = grid_of(ordinal, cu_cap, &grid, &cc90); !why.empty()) return Fail(op, why);
  const bool sm90 = cc90 && !force_portable_builders();
  if (std::string why = check_operands(dy, indices, weights, w1, w2, fws, sm90); !why.empty()) return Fail(op, why);
  const int t = (int)dy.dimensions()[0], H = (int)dy.dimensions()[1], k = (int)indices.dimensions()[1];
  const int E = (int)w1.dimensions()[0], I = (int)w2.dimensions()[1];
  const int R = moe::moe_ep1_rows(t, k, E), S = moe::moe_shared_rows(t, shared != 0);
  const moe::MoeWs F = moe::moe_ws_layout(t, k, 1, E, H, I, shared != 0);
  const moe::MoeBwdWs L = moe::moe_bwd_ws_layout(t, k, E, H, I, shared != 0);
  if (std::string why = check_shared(x, hs, sw1, sw2, shared != 0, t, H, I, k); !why.empty()) return Fail(op, why);
  const Results res{dx, dx_rows, pair_row, dw1, dw2, dsw1, dsw2, ws};
  if (std::string why = check_buffers(fws, res, shared != 0, F.total, L.total, t, H, I, E, k, R + S); !why.empty())
    return Fail(op, why);
  if (!switching && grid < 2)
    return Fail(op, "switching=False needs at least 2 CTAs (a mover and a builder); got a grid of " + std::to_string(grid));
  DeviceGuard guard(ordinal);
  if (guard.err != cudaSuccess) return CudaFail(op, "selecting the device", ordinal, guard.err);
  const std::string err =
      prepare_builders(sm90, ordinal, moe_bwd_portable_prepare, moe_bwd_sm90_prepare, moe_bwd_sm90_ready);
  if (!err.empty()) return ffi::Error::Internal(std::string(op) + ": " + err);
  char* base = static_cast<char*>(ws->untyped_data());
  cudaError_t e = cudaMemsetAsync(base, 0, L.zeroed, stream);
  if (e == cudaSuccess && poison_output()) {
    for (ffi::Result<ffi::AnyBuffer>* r : {&dx, &dx_rows, &pair_row, &dw1, &dw2, &dsw1, &dsw2})
      if (e == cudaSuccess) e = cudaMemsetAsync((*r)->untyped_data(), 0xFF, (*r)->size_bytes(), stream);
  }
  if (e != cudaSuccess) return CudaFail(op, "clearing the workspace", ordinal, e);
  int nt1 = 0, nt2 = 0;
  if (sm90) moe_bwd_sm90_columns(H, I, &nt1, &nt2); else moe::moe_portable_bwd_columns(H, I, &nt1, &nt2);
  moe::MoeFwdParams m{};
  m.s = moe::MoeFwdShape{1, 0, t, k, moe::kMoeBlockTokens, E, moe::kMoeTileRows, nt1, nt2, /*groups=*/4,
                         /*capacity=*/t, /*shared_rb0=*/R / moe::kMoeTileRows, /*shared_blocks=*/S / moe::kMoeTileRows,
                         /*band=*/gemm::swizzle_group(1 << 20, grid, moe::kMoeTileRows, (H + nt2 - 1) / nt2)};
  m.H = H, m.I = I;
  m.x = static_cast<const bf16_t*>(dy.untyped_data());
  m.indices = static_cast<const int*>(indices.untyped_data());
  m.weights = static_cast<const float*>(weights.untyped_data());
  m.y = static_cast<bf16_t*>(dx->untyped_data());
  m.pair_row = static_cast<int*>(pair_row->untyped_data());
  // The backward's gather and fold are the forward's with the gating turned
  // over: output gating sends w * dY and folds with weight 1, input gating
  // sends dY and folds with w (d(w x) / dx).
  m.input_gating = input_gating ? 0 : 1;
  m.ctrl = reinterpret_cast<moe::MoeCtrl*>(base + L.ctrl);
  m.rbs = (R + S) / moe::kMoeTileRows;
  m.rb_flags = reinterpret_cast<uint64_t*>(base + L.rb);
  m.rb_counts = reinterpret_cast<uint32_t*>(base + L.rb + (size_t)16 * m.rbs);
  m.hist = reinterpret_cast<int*>(base + L.hist);
  m.order = reinterpret_cast<int*>(base + L.order);
  m.arena = reinterpret_cast<bf16_t*>(base + L.arena);
  m.y_rows = static_cast<bf16_t*>(dx_rows->untyped_data());
  m.movers = moe_movers(movers, grid, switching != 0, 2);
  m.switching = switching != 0;
  m.timeout_ns = timeout_ns();
  m.trace = trace_buf(ordinal, 0);
  const char* f = static_cast<const char*>(fws.untyped_data());
  const MoeBwdBuffers b{w1.untyped_data(), w2.untyped_data(), f + F.arena, f + F.act, f + F.h1, x.untyped_data(),
                        hs.untyped_data(), sw1.untyped_data(), sw2.untyped_data(), base + L.dh1,
                        dw1->untyped_data(), dw2->untyped_data(), dsw1->untyped_data(), dsw2->untyped_data()};
  e = launch_engine(sm90, m, b, grid, ordinal, stream);
  if (e != cudaSuccess) return CudaFail(op, "launch", ordinal, e);
  ++g_runs[sm90 ? 0 : 1];  // counted once the launch is accepted
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_moe_backward_cuda, MoeBackwardCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()   // dy [t, h] bf16
                                  .Arg<ffi::AnyBuffer>()   // indices [t, k] int32
                                  .Arg<ffi::AnyBuffer>()   // weights [t, k] f32
                                  .Arg<ffi::AnyBuffer>()   // w1 [E, h, 2I] bf16 (gate | up)
                                  .Arg<ffi::AnyBuffer>()   // w2 [E, I, h] bf16
                                  .Arg<ffi::AnyBuffer>()   // fws uint8: the forward's workspace (moe/fwd_ws.h)
                                  .Arg<ffi::AnyBuffer>()   // x [t, h] bf16 (shared), else (1,)
                                  .Arg<ffi::AnyBuffer>()   // hs [t, 2I] bf16 (shared), else (1,)
                                  .Arg<ffi::AnyBuffer>()   // sw1 [h, 2I] bf16 (shared), else (1,)
                                  .Arg<ffi::AnyBuffer>()   // sw2 [I, h] bf16 (shared), else (1,)
                                  .Ret<ffi::AnyBuffer>()   // dx [t, h] bf16 (the experts' part)
                                  .Ret<ffi::AnyBuffer>()   // dx_rows [R + S, h] bf16
                                  .Ret<ffi::AnyBuffer>()   // pair_row [t, k] int32
                                  .Ret<ffi::AnyBuffer>()   // dw1 [E, h, 2I] bf16
                                  .Ret<ffi::AnyBuffer>()   // dw2 [E, I, h] bf16
                                  .Ret<ffi::AnyBuffer>()   // dsw1 [h, 2I] bf16 (shared), else (1,)
                                  .Ret<ffi::AnyBuffer>()   // dsw2 [I, h] bf16 (shared), else (1,)
                                  .Ret<ffi::AnyBuffer>()   // ws uint8 (moe/bwd_ws.h)
                                  .Attr<int64_t>("input_gating")  // the forward's gating
                                  .Attr<int64_t>("shared")        // a shared expert (also the forward's ws layout)
                                  .Attr<int64_t>("cu_cap")        // 0 = all SMs
                                  .Attr<int64_t>("movers")        // -1 = default policy
                                  .Attr<int64_t>("switching"));   // 0: fixed crew
