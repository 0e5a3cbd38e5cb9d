// FFI handler of the MoE backward (CUDA): kosmos_moe_backward, the backward
// megakernel with the shared expert, at EP = 1 or over an EP group whose
// ranks' symmetric heaps hold what peers push (kernels/moe/fwd_heap.h; contract:
// kosmos_jax/ops/_fused_moe_bwd.py). Its body, moe_bwd_run (fused_run.h), is
// also what the loopback hook calls for every rank. Its Hopper builders
// (kernels/moe/bwd_sm90.cuh) on compute capability 9.0, its portable ones
// (kernels/moe/bwd_portable.cuh) on every other GPU or everywhere with
// KOSMOS_FUSED_BUILDERS=portable: one schedule and workspace, each engine's
// tile widths; which ran is counted (moe_backward_engine_runs). It reads the
// forward's workspace (act, h1 and at EP = 1 the gathered x rows of the same
// routing, kernels/moe/fwd_ws.h).
#include <cuda_runtime.h>

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "device.h"
#include "ffi_util.h"
#include "fused_run.h"
#include "gemm/tile_order.h"
#include "handlers.h"
#include "launch.h"
#include "moe/bwd_ws.h"
#include "moe/fwd_heap.h"
#include "moe_bwd_portable.h"
#include "moe_bwd_sm90.h"
#include "moe_heap_peers.h"
#include "trace_buf.h"

namespace ffi = xla::ffi;

using namespace kosmos;
using namespace kosmos::ffi_util;

namespace {

std::atomic<long long> g_runs[2];  // kosmos_moe_backward launches: [0] Hopper builders, [1] portable

// The operands' types and shapes (the engine's limits are moe_bwd_run's): "" or what is wrong.
std::string check_operands(ffi::AnyBuffer dy, ffi::AnyBuffer indices, ffi::AnyBuffer weights, ffi::AnyBuffer w1,
                           ffi::AnyBuffer w2, ffi::AnyBuffer fws) {
  using DT = ffi::DataType;
  auto dd = dy.dimensions(), id = indices.dimensions(), w1d = w1.dimensions(), w2d = w2.dimensions();
  if (dd.size() != 2 || id.size() != 2 || w1d.size() != 3 || w2d.size() != 3 || fws.dimensions().size() != 1)
    return "need dy [t, h], indices [t, k], w1 [E_l, h, 2I], w2 [E_l, I, h], fws [W]; got " + dims(dd) + ", " +
           dims(id) + ", " + dims(w1d) + ", " + dims(w2d) + ", " + dims(fws.dimensions());
  const int64_t t = dd[0], H = dd[1], k = id[1], E = w1d[0], I = w2d[1];
  if (dy.element_type() != DT::BF16 || w1.element_type() != DT::BF16 || w2.element_type() != DT::BF16 ||
      indices.element_type() != DT::S32 || weights.element_type() != DT::F32 || fws.element_type() != DT::U8)
    return "dy, w1, w2 must be bf16, indices int32, weights float32, fws uint8";
  if (id[0] != t || !shaped(weights.dimensions(), {t, k}) || !shaped(w1d, {E, H, 2 * I}) || !shaped(w2d, {E, I, H}))
    return "shapes disagree: dy " + dims(dd) + ", indices " + dims(id) + ", weights " + dims(weights.dimensions()) +
           ", w1 " + dims(w1d) + ", w2 " + dims(w2d);
  if (t < 1 || t > (1 << 24)) return "t=" + std::to_string(t) + " must be in [1, 2^24]";
  return "";
}

// x (with a shared expert or at ep > 1) and the shared expert's operands: "" or what is wrong.
std::string check_x_shared(ffi::AnyBuffer x, ffi::AnyBuffer hs, ffi::AnyBuffer sw1, ffi::AnyBuffer sw2, bool shared,
                           int64_t ep, int64_t t, int64_t H, int64_t I) {
  using DT = ffi::DataType;
  if ((shared || ep > 1) && (!shaped(x.dimensions(), {t, H}) || x.element_type() != DT::BF16))
    return "x " + dims(x.dimensions()) + " must be the forward's input, bf16 [t, h] with t=" + std::to_string(t) +
           ", h=" + std::to_string(H) + " (read with a shared expert, and at ep > 1; ep=" + std::to_string(ep) + ")";
  if (shared && (!shaped(hs.dimensions(), {t, 2 * I}) || !shaped(sw1.dimensions(), {H, 2 * I}) ||
                 !shaped(sw2.dimensions(), {I, H}) || hs.element_type() != DT::BF16 ||
                 sw1.element_type() != DT::BF16 || sw2.element_type() != DT::BF16))
    return "the shared expert's hs " + dims(hs.dimensions()) + ", sw1 " + dims(sw1.dimensions()) + ", sw2 " +
           dims(sw2.dimensions()) + " must be bf16 [t, 2I], [h, 2I], [I, h] with t=" + std::to_string(t) +
           ", h=" + std::to_string(H) + ", I=" + std::to_string(I);
  return "";
}

// The results' shapes: "" or what is wrong.
std::string check_results(ffi::Result<ffi::AnyBuffer>* r, bool shared, int64_t t, int64_t H, int64_t I,
                          int64_t E, int64_t k) {
  ffi::Result<ffi::AnyBuffer> &dx = r[0], &dx_rows = r[1], &pair_row = r[2], &dw1 = r[3], &dw2 = r[4], &dsw1 = r[5],
                              &dsw2 = r[6];
  if (!shaped(dx->dimensions(), {t, H}) || dx_rows->dimensions().size() != 2 || dx_rows->dimensions()[1] != H ||
      !shaped(pair_row->dimensions(), {t, k}) || !shaped(dw1->dimensions(), {E, H, 2 * I}) ||
      !shaped(dw2->dimensions(), {E, I, H}) ||
      (shared && (!shaped(dsw1->dimensions(), {H, 2 * I}) || !shaped(dsw2->dimensions(), {I, H}))))
    return "results must be dx [t, h], dx_rows [R + S + P, h], pair_row [t, k], dw1 [E_l, h, 2I], dw2 [E_l, I, h]" +
           std::string(shared ? ", dsw1 [h, 2I], dsw2 [I, h]" : "") + "; got dx " + dims(dx->dimensions()) +
           ", dx_rows " + dims(dx_rows->dimensions()) + ", dw1 " + dims(dw1->dimensions());
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

// The launch's parameters over the workspace at `base` (laid out by L): the
// shape with the engine's column blocks, the control words, the knobs.
moe::MoeFwdParams bwd_params(const MoeBwdArgs& a, int rank, int grid, bool sm90, const moe::MoeBwdWs& L, char* base) {
  const int t = (int)a.t, H = (int)a.H, I = (int)a.I;
  const int R = moe::moe_rank_rows(t, (int)a.k, (int)a.ep, (int)a.e_local), S = moe::moe_shared_rows(t, a.shared);
  int nt1 = 0, nt2 = 0;
  if (sm90) moe_bwd_sm90_columns(H, I, &nt1, &nt2); else moe::moe_portable_bwd_columns(H, I, &nt1, &nt2);
  moe::MoeFwdParams m{};
  m.s = moe::MoeFwdShape{(int)a.ep, rank, t, (int)a.k, moe::kMoeBlockTokens, (int)a.e_local, moe::kMoeTileRows, nt1,
                         nt2, /*groups=*/4, /*capacity=*/t, /*shared_rb0=*/R / moe::kMoeTileRows,
                         /*shared_blocks=*/S / moe::kMoeTileRows,
                         /*band=*/gemm::swizzle_group(1 << 20, grid, moe::kMoeTileRows, (H + nt2 - 1) / nt2),
                         /*x_parts=*/a.ep > 1};
  m.H = H, m.I = I;
  m.x = static_cast<const bf16_t*>(a.dy);
  m.x_fwd = static_cast<const bf16_t*>(a.x);
  m.indices = static_cast<const int*>(a.indices);
  m.weights = static_cast<const float*>(a.weights);
  m.y = static_cast<bf16_t*>(a.dx);
  m.pair_row = static_cast<int*>(a.pair_row);
  // The backward's gather and fold are the forward's with the gating turned
  // over: output gating sends w * dY and folds with weight 1, input gating
  // sends dY and folds with w (d(w x) / dx).
  m.input_gating = a.input_gating ? 0 : 1;
  m.ctrl = reinterpret_cast<moe::MoeCtrl*>(base + L.ctrl);
  m.rbs = (R + S) / moe::kMoeTileRows;
  m.rb_flags = reinterpret_cast<uint64_t*>(base + L.rb);
  m.rb_counts = reinterpret_cast<uint32_t*>(base + L.rb + (size_t)16 * m.rbs);
  m.hist = reinterpret_cast<int*>(base + L.hist);
  m.order = reinterpret_cast<int*>(base + L.order);
  m.arena = reinterpret_cast<bf16_t*>(base + L.arena);
  m.y_rows = static_cast<bf16_t*>(a.dx_rows);
  m.movers = moe_movers(a.movers, grid, a.switching != 0, 2);
  m.switching = a.switching != 0;
  m.timeout_ns = timeout_ns();
  return m;
}

}  // namespace

std::vector<std::pair<std::string, long long>> kosmos::moe_backward_engine_runs() { return engine_counts(g_runs); }

ffi::Error kosmos::moe_bwd_run(cudaStream_t stream, int ordinal, const GroupInfo& g, int ctrl_slot,
                               const MoeBwdArgs& a) {
  const char* op = "kosmos_moe_backward";
  const int t = (int)a.t, H = (int)a.H, k = (int)a.k, el = (int)a.e_local, I = (int)a.I, ep = (int)a.ep;
  if (ep < 1 || ep > moe::kEpMaxRanks || (ep > 1 && (g.rank < 0 || g.rank >= ep)))
    return Fail(op, "ep=" + std::to_string(ep) + " must be in 1.." + std::to_string(moe::kEpMaxRanks) +
                        " with this device's rank in it (rank " + std::to_string(g.rank) + ")");
  int grid = 0;
  bool cc90 = false;
  if (std::string why = grid_of(ordinal, a.cu_cap, &grid, &cc90); !why.empty()) return Fail(op, why);
  const bool sm90 = cc90 && !force_portable_builders();
  const std::string why = sm90 ? moe_bwd_sm90_unsupported(H, I, ep * el, k)
                               : moe::moe_bwd_portable_unsupported(H, I, ep * el, k);
  if (!why.empty())
    return Fail(op, why + " (h=" + std::to_string(H) + ", I=" + std::to_string(I) + ", E=" +
                        std::to_string(ep * el) + ", k=" + std::to_string(k) + "; " + (sm90 ? "Hopper" : "portable") +
                        " builders)");
  if (std::string why = moe_shared_top_k(a.shared, k); !why.empty()) return Fail(op, why);
  const int R = moe::moe_rank_rows(t, k, ep, el), S = moe::moe_shared_rows(t, a.shared);
  const int P = moe::moe_return_rows(t, k, ep, ep * el);
  const moe::MoeWs F = moe::moe_ws_layout(t, k, ep, el, H, I, a.shared);
  const moe::MoeBwdWs L = moe::moe_bwd_ws_layout(t, k, ep, el, H, I, a.shared);
  if (a.fws_bytes < F.total)
    return Fail(op, "the forward's workspace fws has " + std::to_string(a.fws_bytes) + " bytes; the forward of "
                    "this shape (shared=" + std::to_string(a.shared) + ", ep=" + std::to_string(ep) + ") leaves " +
                    std::to_string(F.total));
  if (a.dx_rows_rows != R + S + P)
    return Fail(op, "dx_rows has " + std::to_string(a.dx_rows_rows) + " rows; it must have R + S + P = " +
                        std::to_string(R + S + P) + " (kosmos_jax.ops._fused_moe.y_rows_rows)");
  if (a.ws_bytes < L.total)
    return Fail(op, "workspace of " + std::to_string(a.ws_bytes) + " bytes; it must hold " + std::to_string(L.total) +
                        " (kosmos_jax.ops._fused_moe_bwd.workspace_bytes)");
  const moe::MoeHeap heap = moe::moe_heap_layout(t, k, ep, el, H, /*xrows=*/true);
  if (ep > 1)
    if (std::string why = moe_heap_refusal(heap, g, t, k, ep); !why.empty()) return Fail(op, why);
  if (!a.switching && grid < 2)
    return Fail(op, "switching=False needs at least 2 CTAs (a mover and a builder); got a grid of " +
                        std::to_string(grid));
  DeviceGuard guard(ordinal);
  if (guard.err != cudaSuccess) return CudaFail(op, "selecting the device", ordinal, guard.err);
  const std::string err =
      prepare_builders(sm90, ordinal, moe_bwd_portable_prepare, moe_bwd_sm90_prepare, moe_bwd_sm90_ready);
  if (!err.empty()) return ffi::Error::Internal(std::string(op) + ": " + err);
  char* base = static_cast<char*>(a.ws);
  cudaError_t e = cudaMemsetAsync(base, 0, L.zeroed, stream);
  if (e == cudaSuccess && poison_output()) {
    const size_t E2 = (size_t)el * H * 2 * I * 2;
    const std::pair<void*, size_t> outs[] = {{a.dx, (size_t)t * H * 2}, {a.dx_rows, (size_t)a.dx_rows_rows * H * 2},
                                             {a.pair_row, (size_t)t * k * 4}, {a.dw1, E2}, {a.dw2, E2 / 2},
                                             {a.dsw1, a.shared ? (size_t)H * 2 * I * 2 : 0},
                                             {a.dsw2, a.shared ? (size_t)H * I * 2 : 0}};
    for (const auto& [ptr, bytes] : outs)
      if (e == cudaSuccess && bytes > 0) e = cudaMemsetAsync(ptr, 0xFF, bytes, stream);
  }
  if (e != cudaSuccess) return CudaFail(op, "clearing the workspace", ordinal, e);
  moe::MoeFwdParams m = bwd_params(a, ep > 1 ? g.rank : 0, grid, sm90, L, base);
  if (ep > 1) moe_heap_peers(&m, g, ctrl_slot, heap, ep, true);
  m.trace = trace_buf(ordinal, ep > 1 ? g.rank : 0, g.trace_list);
  // wgrad1's X rows: the forward's gathered rows at EP = 1, the X arena peers push into at EP > 1.
  const char* f = static_cast<const char*>(a.fws);
  const void* x_rows = ep > 1 ? static_cast<const void*>(m.peer_xrows[g.rank]) : f + F.arena;
  const MoeBwdBuffers b{a.w1, a.w2, x_rows, f + F.act, f + F.h1, a.x, a.hs, a.sw1, a.sw2, base + L.dh1,
                        a.dw1, a.dw2, a.dsw1, a.dsw2};
  e = launch_engine(sm90, m, b, grid, ordinal, stream);
  if (e != cudaSuccess) return CudaFail(op, "launch", ordinal, e);
  ++g_runs[sm90 ? 0 : 1];  // counted once the launch is accepted
  return ffi::Error::Success();
}

static ffi::Error MoeBackwardCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer dy, ffi::AnyBuffer indices,
                                  ffi::AnyBuffer weights, ffi::AnyBuffer w1, ffi::AnyBuffer w2, ffi::AnyBuffer fws,
                                  ffi::AnyBuffer x, ffi::AnyBuffer hs, ffi::AnyBuffer sw1, ffi::AnyBuffer sw2,
                                  ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> dx_rows,
                                  ffi::Result<ffi::AnyBuffer> pair_row, ffi::Result<ffi::AnyBuffer> dw1,
                                  ffi::Result<ffi::AnyBuffer> dw2, ffi::Result<ffi::AnyBuffer> dsw1,
                                  ffi::Result<ffi::AnyBuffer> dsw2, ffi::Result<ffi::AnyBuffer> ws,
                                  int64_t input_gating, int64_t shared, int64_t cu_cap, int64_t movers,
                                  int64_t switching, ffi::Span<const int64_t> groups, int64_t ep,
                                  ffi::Span<const int64_t> slots) {
  const char* op = "kosmos_moe_backward";
  if (std::string why = check_operands(dy, indices, weights, w1, w2, fws); !why.empty()) return Fail(op, why);
  const int64_t t = dy.dimensions()[0], H = dy.dimensions()[1], k = indices.dimensions()[1];
  const int64_t el = w1.dimensions()[0], I = w2.dimensions()[1];
  if (std::string why = check_x_shared(x, hs, sw1, sw2, shared != 0, ep, t, H, I); !why.empty())
    return Fail(op, why);
  ffi::Result<ffi::AnyBuffer> res[] = {dx, dx_rows, pair_row, dw1, dw2, dsw1, dsw2};
  if (std::string why = check_results(res, shared != 0, t, H, I, el, k); !why.empty()) return Fail(op, why);
  GroupInfo g;
  int ctrl_slot = -1;
  if (ep > 1) {
    if (auto err = find_group_slot(op, ordinal, groups, ep, slots, &g, &ctrl_slot); !err.empty()) return Fail(op, err);
  }
  const MoeBwdArgs a{dy.untyped_data(), indices.untyped_data(), weights.untyped_data(), w1.untyped_data(),
                     w2.untyped_data(), fws.untyped_data(), x.untyped_data(), hs.untyped_data(), sw1.untyped_data(),
                     sw2.untyped_data(), dx->untyped_data(), dx_rows->untyped_data(), pair_row->untyped_data(),
                     dw1->untyped_data(), dw2->untyped_data(), dsw1->untyped_data(), dsw2->untyped_data(),
                     ws->untyped_data(), fws.size_bytes(), ws->size_bytes(), dx_rows->dimensions()[0], t, H, k, el, I,
                     ep, shared != 0, input_gating != 0, cu_cap, movers, switching};
  return moe_bwd_run(stream, ordinal, g, ctrl_slot, a);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_moe_backward_cuda, MoeBackwardCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()   // dy [t, h] bf16
                                  .Arg<ffi::AnyBuffer>()   // indices [t, k] int32
                                  .Arg<ffi::AnyBuffer>()   // weights [t, k] f32
                                  .Arg<ffi::AnyBuffer>()   // w1 [E_l, h, 2I] bf16 (gate | up): our experts
                                  .Arg<ffi::AnyBuffer>()   // w2 [E_l, I, h] bf16
                                  .Arg<ffi::AnyBuffer>()   // fws uint8: the forward's workspace (moe/fwd_ws.h)
                                  .Arg<ffi::AnyBuffer>()   // x [t, h] bf16 (shared or ep > 1), else (1,)
                                  .Arg<ffi::AnyBuffer>()   // hs [t, 2I] bf16 (shared), else (1,)
                                  .Arg<ffi::AnyBuffer>()   // sw1 [h, 2I] bf16 (shared), else (1,)
                                  .Arg<ffi::AnyBuffer>()   // sw2 [I, h] bf16 (shared), else (1,)
                                  .Ret<ffi::AnyBuffer>()   // dx [t, h] bf16 (the experts' part)
                                  .Ret<ffi::AnyBuffer>()   // dx_rows [R + S + P, h] bf16
                                  .Ret<ffi::AnyBuffer>()   // pair_row [t, k] int32
                                  .Ret<ffi::AnyBuffer>()   // dw1 [E_l, h, 2I] bf16
                                  .Ret<ffi::AnyBuffer>()   // dw2 [E_l, I, h] bf16
                                  .Ret<ffi::AnyBuffer>()   // dsw1 [h, 2I] bf16 (shared), else (1,)
                                  .Ret<ffi::AnyBuffer>()   // dsw2 [I, h] bf16 (shared), else (1,)
                                  .Ret<ffi::AnyBuffer>()   // ws uint8 (moe/bwd_ws.h)
                                  .Attr<int64_t>("input_gating")  // the forward's gating
                                  .Attr<int64_t>("shared")        // a shared expert (also the forward's ws layout)
                                  .Attr<int64_t>("cu_cap")        // 0 = all SMs
                                  .Attr<int64_t>("movers")        // -1 = default policy
                                  .Attr<int64_t>("switching")     // 0: fixed crew
                                  .Attr<ffi::Span<const int64_t>>("groups")  // [n_groups*ep] global ids (ep > 1)
                                  .Attr<int64_t>("ep")                       // EP group size
                                  .Attr<ffi::Span<const int64_t>>("slots")); // [n_groups] control slots (ep > 1)
