// FFI handler of the MoE forward (CUDA): kosmos_moe_forward, the forward
// megakernel with the shared expert (routing runs in XLA before it,
// kosmos_jax/ops/_fused_moe.py), at EP = 1 or over an EP group whose ranks'
// symmetric heaps hold what peers push (moe/fwd_heap.h). Its body, moe_fwd_run
// (fused_run.h), is also what the loopback hook calls for every rank. The expert GEMMs alone (the benchmark's
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
#include "fused_run.h"
#include "handlers.h"
#include "launch.h"
#include "gemm/tile_order.h"
#include "moe/fwd_heap.h"
#include "moe/fwd_ws.h"
#include "moe_heap_peers.h"
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
  int64_t t, H, k, E, I;     // E: every expert of the group (ep x E_l)
  int64_t ep, e_local;
  int R, S, P, nt1, nt2, grid;  // arena rows, the shared expert's rows (0: none), returned rows (EP > 1)
  int band;                  // row blocks per band of the tile order (gemm::swizzle_group)
  bool input_gating, switching, keep_preacts;
  int64_t movers;
};

// The launch's parameters over the workspace at `base` (laid out by L): the
// shape with the engine's column blocks (nt1, nt2), every pointer, the knobs.
moe::MoeFwdParams moe_params(const MoeCall& c, int rank, const moe::MoeWs& L, char* base, const void* x,
                             const void* indices, const void* weights, void* y, void* y_rows, void* pair_row, void* hs) {
  moe::MoeFwdParams m{};
  // capacity t: the arena holds every pair a source can send (moe_rank_rows), so
  // the layout never reports an overflow.
  m.s = moe::MoeFwdShape{(int)c.ep, rank, (int)c.t, (int)c.k, moe::kMoeBlockTokens, (int)c.e_local, moe::kMoeTileRows,
                         c.nt1, c.nt2, /*groups=*/4, /*capacity=*/(int)c.t, /*shared_rb0=*/c.R / moe::kMoeTileRows,
                         /*shared_blocks=*/c.S / moe::kMoeTileRows, /*band=*/c.band};
  m.H = (int)c.H, m.I = (int)c.I;
  m.x = static_cast<const bf16_t*>(x);
  m.indices = static_cast<const int*>(indices);
  m.weights = static_cast<const float*>(weights);
  m.y = static_cast<bf16_t*>(y);
  m.pair_row = static_cast<int*>(pair_row);
  m.hs = c.S > 0 && c.keep_preacts ? static_cast<bf16_t*>(hs) : nullptr;
  m.input_gating = c.input_gating;
  m.ctrl = reinterpret_cast<moe::MoeCtrl*>(base + L.ctrl);
  m.rbs = (c.R + c.S) / moe::kMoeTileRows;
  m.rb_flags = reinterpret_cast<uint64_t*>(base + L.rb);
  m.rb_counts = reinterpret_cast<uint32_t*>(base + L.rb + (size_t)16 * m.rbs);
  m.hist = reinterpret_cast<int*>(base + L.hist);
  m.order = reinterpret_cast<int*>(base + L.order);
  m.arena = reinterpret_cast<bf16_t*>(base + L.arena);
  m.act = reinterpret_cast<bf16_t*>(base + L.act);
  m.h1 = c.keep_preacts ? reinterpret_cast<bf16_t*>(base + L.h1) : nullptr;  // no region then (fwd_ws.h)
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
    return "need x [t, h], indices [t, k], w1 [E_l, h, 2I], w2 [E_l, I, h]; got " + dims(xd) + ", " + dims(id) + ", " +
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

ffi::Error kosmos::moe_fwd_run(cudaStream_t stream, int ordinal, const GroupInfo& g, int ctrl_slot,
                               const MoeFwdArgs& a) {
  const char* op = "kosmos_moe_forward";
  MoeCall c{a.t, a.H, a.k, a.ep * a.e_local, a.I, a.ep, a.e_local};
  c.input_gating = a.input_gating != 0, c.switching = a.switching != 0, c.movers = a.movers;
  c.keep_preacts = a.keep_preacts;
  if (a.ep < 1 || a.ep > moe::kEpMaxRanks || (a.ep > 1 && (g.rank < 0 || g.rank >= a.ep)))
    return Fail(op, "ep=" + std::to_string(a.ep) + " must be in 1.." + std::to_string(moe::kEpMaxRanks) +
                        " with this device's rank in it (rank " + std::to_string(g.rank) + ")");
  bool cc90 = false;
  if (std::string why = grid_of(ordinal, a.cu_cap, &c.grid, &cc90); !why.empty()) return Fail(op, why);
  const bool sm90 = hopper_builders(cc90);
  if (std::string why = engine_refuses(sm90, c.H, c.I, c.E, c.k); !why.empty()) return Fail(op, why);
  if (sm90) moe_fwd_sm90_columns((int)c.H, (int)c.I, &c.nt1, &c.nt2);
  else moe_fwd_portable_columns((int)c.H, (int)c.I, &c.nt1, &c.nt2);
  // The floor's band for the grid: each tile is 128 rows by (H / nt2) columns.
  c.band = gemm::swizzle_group(1 << 20, c.grid, moe::kMoeTileRows, (int)((c.H + c.nt2 - 1) / c.nt2));
  c.R = moe::moe_rank_rows((int)c.t, (int)c.k, (int)c.ep, (int)c.e_local);
  c.S = moe::moe_shared_rows((int)c.t, a.shared);
  c.P = moe::moe_return_rows((int)c.t, (int)c.k, (int)c.ep, (int)c.E);
  if (std::string why = moe_shared_top_k(a.shared, c.k); !why.empty()) return Fail(op, why);
  const moe::MoeWs L =
      moe::moe_ws_layout((int)c.t, (int)c.k, (int)c.ep, (int)c.e_local, (int)c.H, (int)c.I, a.shared, c.keep_preacts);
  if (a.y_rows_rows != c.R + c.S + c.P)
    return Fail(op, "y_rows has " + std::to_string(a.y_rows_rows) + " rows; it must have R + S + P = " +
                        std::to_string(c.R + c.S + c.P) + " (kosmos_jax.ops._fused_moe.y_rows_rows)");
  if (a.ws_bytes < L.total)
    return Fail(op, "workspace of " + std::to_string(a.ws_bytes) + " bytes; it must hold " + std::to_string(L.total) +
                        " (kosmos_jax.ops._fused_moe.workspace_bytes)");
  const moe::MoeHeap heap = moe::moe_heap_layout((int)c.t, (int)c.k, (int)c.ep, (int)c.e_local, (int)c.H);
  if (c.ep > 1)
    if (std::string why = moe_heap_refusal(heap, g, c.t, c.k, c.ep); !why.empty()) return Fail(op, why);
  if (!c.switching && c.grid < 2)
    return Fail(op, "switching=False needs at least 2 CTAs (a mover and a builder); got a grid of " + std::to_string(c.grid));
  DeviceGuard guard(ordinal);
  if (guard.err != cudaSuccess) return CudaFail(op, "selecting the device", ordinal, guard.err);
  const std::string err =
      prepare_builders(sm90, ordinal, moe_fwd_portable_prepare, moe_fwd_sm90_prepare, moe_fwd_sm90_ready);
  char* base = static_cast<char*>(a.ws);
  cudaError_t e = err.empty() ? cudaMemsetAsync(base, 0, L.zeroed, stream) : cudaSuccess;
  if (e == cudaSuccess && err.empty() && poison_output()) {
    e = cudaMemsetAsync(a.y, 0xFF, (size_t)c.t * c.H * 2, stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(a.y_rows, 0xFF, (size_t)a.y_rows_rows * c.H * 2, stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(a.pair_row, 0xFF, (size_t)c.t * c.k * 4, stream);
    if (e == cudaSuccess && a.shared && a.keep_preacts)
      e = cudaMemsetAsync(a.hs, 0xFF, (size_t)c.t * 2 * c.I * 2, stream);
  }
  if (e == cudaSuccess && err.empty()) {
    moe::MoeFwdParams m = moe_params(c, c.ep > 1 ? g.rank : 0, L, base, a.x, a.indices, a.weights, a.y, a.y_rows,
                                     a.pair_row, a.hs);
    if (c.ep > 1) moe_heap_peers(&m, g, ctrl_slot, heap, (int)c.ep, false);
    m.trace = trace_buf(ordinal, c.ep > 1 ? g.rank : 0, g.trace_list);
    e = sm90 ? moe_fwd_sm90_launch(m, a.w1, a.w2, a.sw1, a.sw2, c.grid, stream)
             : moe_fwd_portable_launch(m, a.w1, a.w2, a.sw1, a.sw2, c.grid, ordinal, stream);
    if (e == cudaSuccess) ++g_runs[sm90 ? 0 : 1];  // counted once the launch is accepted
  }
  if (!err.empty()) return ffi::Error::Internal(std::string(op) + ": " + err);
  if (e != cudaSuccess) return CudaFail(op, "launch", ordinal, e);
  return ffi::Error::Success();
}

static ffi::Error MoeForwardCuda(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x, ffi::AnyBuffer indices,
                                 ffi::AnyBuffer weights, ffi::AnyBuffer w1, ffi::AnyBuffer w2, ffi::AnyBuffer sw1,
                                 ffi::AnyBuffer sw2, ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> y_rows,
                                 ffi::Result<ffi::AnyBuffer> pair_row, ffi::Result<ffi::AnyBuffer> hs,
                                 ffi::Result<ffi::AnyBuffer> ws, int64_t input_gating, int64_t shared, int64_t cu_cap,
                                 int64_t movers, int64_t switching, int64_t keep_preacts,
                                 ffi::Span<const int64_t> groups, int64_t ep, ffi::Span<const int64_t> slots) {
  const char* op = "kosmos_moe_forward";
  if (std::string why = check_operands(x, indices, weights, w1, w2, sw1, sw2, shared); !why.empty()) return Fail(op, why);
  const int64_t t = x.dimensions()[0], H = x.dimensions()[1], k = indices.dimensions()[1], I = w2.dimensions()[1];
  if (!shaped(y->dimensions(), {t, H}) || y_rows->dimensions().size() != 2 || y_rows->dimensions()[1] != H ||
      !shaped(pair_row->dimensions(), {t, k}) || (shared && keep_preacts && !shaped(hs->dimensions(), {t, 2 * I})))
    return Fail(op, "results must be y [t, h], y_rows [R + S + P, h], pair_row [t, k]" +
                        std::string(shared && keep_preacts ? ", hs [t, 2I]" : "") + "; got y " +
                        dims(y->dimensions()) + ", y_rows " +
                        dims(y_rows->dimensions()) + ", pair_row " + dims(pair_row->dimensions()));
  GroupInfo g;
  int ctrl_slot = -1;
  if (ep > 1) {
    if (auto err = find_group_slot(op, ordinal, groups, ep, slots, &g, &ctrl_slot); !err.empty()) return Fail(op, err);
  }
  MoeFwdArgs a{x.untyped_data(), indices.untyped_data(), weights.untyped_data(), w1.untyped_data(), w2.untyped_data(),
               sw1.untyped_data(), sw2.untyped_data(), y->untyped_data(), y_rows->untyped_data(),
               pair_row->untyped_data(), hs->untyped_data(), ws->untyped_data(), ws->size_bytes(),
               y_rows->dimensions()[0], t, H, k, w1.dimensions()[0], I, ep, shared != 0, input_gating != 0, cu_cap,
               movers, switching, keep_preacts != 0};
  return moe_fwd_run(stream, ordinal, g, ctrl_slot, a);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(kosmos_moe_forward_cuda, MoeForwardCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()   // x [t, h] bf16
                                  .Arg<ffi::AnyBuffer>()   // indices [t, k] int32
                                  .Arg<ffi::AnyBuffer>()   // weights [t, k] f32
                                  .Arg<ffi::AnyBuffer>()   // w1 [E_l, h, 2I] bf16 (gate | up): our experts
                                  .Arg<ffi::AnyBuffer>()   // w2 [E_l, I, h] bf16
                                  .Arg<ffi::AnyBuffer>()   // sw1 [h, 2I] bf16 (shared), else (1,)
                                  .Arg<ffi::AnyBuffer>()   // sw2 [I, h] bf16 (shared), else (1,)
                                  .Ret<ffi::AnyBuffer>()   // y [t, h] bf16
                                  .Ret<ffi::AnyBuffer>()   // y_rows [R + S + P, h] bf16
                                  .Ret<ffi::AnyBuffer>()   // pair_row [t, k] int32
                                  .Ret<ffi::AnyBuffer>()   // hs [t, 2I] bf16 (shared, keep_preacts), else (1,)
                                  .Ret<ffi::AnyBuffer>()   // ws uint8 (moe/fwd_ws.h)
                                  .Attr<int64_t>("input_gating")
                                  .Attr<int64_t>("shared")
                                  .Attr<int64_t>("cu_cap")      // 0 = all SMs
                                  .Attr<int64_t>("movers")      // -1 = default policy
                                  .Attr<int64_t>("switching")   // 0: fixed crew
                                  .Attr<int64_t>("keep_preacts")  // 0: none kept (hs (1,)): no backward reads
                                  .Attr<ffi::Span<const int64_t>>("groups")  // [n_groups*ep] global ids (ep > 1)
                                  .Attr<int64_t>("ep")                       // EP group size
                                  .Attr<ffi::Span<const int64_t>>("slots")); // [n_groups] control slots (ep > 1)
