// The fused handlers' bodies without XLA buffer types. The kosmos_* handlers
// (ag_tn_cuda.cu, tn_rs_cuda.cu, bulk_*_cuda.cu) call them once they have found
// this device's group; so does the loopback test hook (loopback.cu), which runs
// every rank of a group as a concurrent launch on one GPU. One body for both is
// the point: the hook tests the launch path XLA takes, not a copy of it. The
// bodies end in one launch tail (launch_fused), so every op picks, launches and
// counts its engine alike.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>

#include "kosmos/types.h"
#include "launch.h"
#include "xla/ffi/api/ffi.h"

namespace kosmos {

// How rows (AG) or partials (RS) travel between ranks: kernel_config's
// TRANSPORTS and RS_TRANSPORTS. It crosses the FFI and the loopback hook as its
// name, never as a number, so a caller cannot pass a code that means something
// else to another op; parse_transport turns the name into this once, and each
// run body refuses the transports its op lacks.
enum class Transport { kPull, kPush, kPushFold };

inline const char* transport_name(Transport t) {
  return t == Transport::kPull ? "pull" : t == Transport::kPush ? "push" : "push_fold";
}

// "" with *out set when `name` is one of `allowed` (the transports of `op`),
// else an error naming the op, the value and the allowed names.
inline std::string parse_transport(const char* op, std::string_view name, std::initializer_list<Transport> allowed,
                                   Transport* out) {
  std::string names;
  for (Transport t : allowed) {
    if (name == transport_name(t)) {
      *out = t;
      return "";
    }
    names += std::string(names.empty() ? "'" : ", '") + transport_name(t) + "'";
  }
  return std::string(op) + ": transport='" + std::string(name) + "' is not one of " + names;
}

// Every transport: what the loopback hook accepts before the run bodies check the op's.
constexpr std::initializer_list<Transport> kAllTransports = {Transport::kPull, Transport::kPush, Transport::kPushFold};

// One rank's call of kosmos_ag_tn: y [rows/m_local, tp*m_local, n] =
// allgather_rows(x [rows, k]) @ w [k, n]; the knobs as the FFI attributes.
struct AgArgs {
  const void* x;
  const void* w;
  void* y;
  size_t y_bytes;
  xla::ffi::DataType dtype;
  int64_t rows, m_local, K, N;
  int64_t tp, cu_cap, movers, switching;
  Transport transport;  // pull or push (push_fold is GEMM+RS's)
  // kosmos_ag_nn: dX [rows/m_local, tp*m_local, N] = allgather_rows(dY [rows, K]) @ w.T
  // (w [N, K]), and allgather_rows(dY) into g_out (g_bytes), pull transport only.
  int64_t nn = 0;
  void* g_out = nullptr;
  size_t g_bytes = 0;
};

// One rank's call of kosmos_tn_rs: y [rows, n] = chunk `rank` of
// reduce_scatter_rows(x [tp*rows, k] @ w [k, n]).
struct RsArgs {
  const void* x;
  const void* w;
  void* y;
  size_t y_bytes;
  xla::ffi::DataType dtype;
  int64_t rows, K, N;
  int64_t tp, cu_cap, reducers, stage_bf16, switching, band_rows;
  Transport transport;
};

// Validates, plans and launches on `stream`; `g` and `ctrl_slot` as find_group_slot
// returns them. Errors name the op and the values.
xla::ffi::Error ag_tn_run(CUstream_st* stream, int ordinal, const GroupInfo& g, int ctrl_slot, const AgArgs& a);
// The same body serves kosmos_ag_nn (a.nn == 1).
inline xla::ffi::Error ag_nn_run(CUstream_st* stream, int ordinal, const GroupInfo& g, int ctrl_slot, AgArgs a) {
  a.nn = 1;
  return ag_tn_run(stream, ordinal, g, ctrl_slot, a);
}

// One rank's call of kosmos_bulk_ag_nn: xg [rows/m_local, tp*m_local, k] =
// allgather_rows(x [rows, k]) beside dx [M, k] = dy [M, n] @ w [k, n].T, with
// M = tp * rows; the knobs as the FFI attributes.
struct BulkAgArgs {
  const void* x;
  const void* dy;
  const void* w;
  void* xg;
  void* dx;
  size_t xg_bytes, dx_bytes;
  xla::ffi::DataType dtype;
  int64_t rows, m_local, K, N;
  int64_t tp, cu_cap, movers, switching;
};
xla::ffi::Error bulk_ag_nn_run(CUstream_st* stream, int ordinal, const GroupInfo& g, int ctrl_slot,
                               const BulkAgArgs& a);
xla::ffi::Error tn_rs_run(CUstream_st* stream, int ordinal, const GroupInfo& g, int ctrl_slot, const RsArgs& a);

// One rank's call of kosmos_bulk_rs_nt: dx [rows, K] = chunk `rank` of
// reduce_scatter_rows(dxp [tp*rows, K], rank-major: chunk c = rows [c*rows,
// (c+1)*rows)) beside dw [K, N] = xg [M, K]^T @ dy [M, N], M = tp * rows; the
// knobs as the FFI attributes (movers -1: the default policy).
struct BulkRsArgs {
  const void* dxp;
  const void* xg;
  const void* dy;
  void* dx;
  void* dw;
  size_t dx_bytes, dw_bytes;
  xla::ffi::DataType dtype;
  int64_t rows, K, N;
  int64_t tp, cu_cap, movers, switching;
};
xla::ffi::Error bulk_rs_nt_run(CUstream_st* stream, int ordinal, const GroupInfo& g, int ctrl_slot,
                               const BulkRsArgs& a);

// One rank's call of kosmos_moe_forward (csrc/moe_fwd_cuda.cu): the MoE
// forward over its EP group (ep = 1: one rank, no heap), shapes as the FFI
// operands and results (kosmos_jax/ops/_fused_moe.py); w1 / w2 hold this
// rank's e_local experts, indices name experts of the whole group.
struct MoeFwdArgs {
  const void *x, *indices, *weights, *w1, *w2, *sw1, *sw2;
  void *y, *y_rows, *pair_row, *hs, *ws;
  size_t ws_bytes;
  int64_t y_rows_rows;
  int64_t t, H, k, e_local, I, ep;
  bool shared, input_gating;
  int64_t cu_cap, movers, switching;
  bool keep_preacts = true;  // GEMM1's pre-activations for the backward (hs among the results then)
};
// `g` and `ctrl_slot` as find_group_slot returns them (unused at ep = 1).
xla::ffi::Error moe_fwd_run(CUstream_st* stream, int ordinal, const GroupInfo& g, int ctrl_slot, const MoeFwdArgs& a);

// One rank's call of kosmos_moe_backward (csrc/moe_bwd_cuda.cu): the MoE
// backward over its EP group after a forward of the same routing, whose
// workspace fws it reads; shapes as the FFI operands and results
// (kosmos_jax/ops/_fused_moe_bwd.py). x [t, h] (the forward's input) is read
// with a shared expert, and at ep > 1 (the X rows each owner's wgrad1 needs).
struct MoeBwdArgs {
  const void *dy, *indices, *weights, *w1, *w2, *fws, *x, *hs, *sw1, *sw2;
  void *dx, *dx_rows, *pair_row, *dw1, *dw2, *dsw1, *dsw2, *ws;
  size_t fws_bytes, ws_bytes;
  int64_t dx_rows_rows;
  int64_t t, H, k, e_local, I, ep;
  bool shared, input_gating;  // input_gating: the forward's
  int64_t cu_cap, movers, switching;
};
xla::ffi::Error moe_bwd_run(CUstream_st* stream, int ordinal, const GroupInfo& g, int ctrl_slot, const MoeBwdArgs& a);

// A run body's launch, once it has validated and planned: the op's one
// persistent kernel on `grid` CTAs, its output `y` poisoned first under
// KOSMOS_POISON_OUTPUT (launch_prologue).
struct FusedLaunch {
  const char* op;
  cudaStream_t stream;
  int ordinal, grid;
  int dtype;  // dtype_index: 0 f32, 1 f16, 2 bf16
  bool sm90;  // the Hopper builders apply (hopper_builders_apply and the op's own conditions)
  void* y;
  size_t y_bytes;
};

// Builds the kernel parameters for the launch's element type T with make((T*)
// nullptr), then launches: bf16 with f.sm90 through the op's Hopper launch
// sm90(params, grid, stream) (a function, or a lambda that picks the op's
// transport instantiation; counted in runs[0]), anything else the portable kernel k.fn[dtype]
// (counted in runs[1]). A launch is counted only once accepted, so the engine
// counters (*_engine_runs) report what ran, never what was meant to.
template <class Make, class Sm90>
xla::ffi::Error launch_fused(const FusedLaunch& f, const PersistentKernels& k, std::atomic<long long>* runs,
                             Make&& make, Sm90&& sm90) {
  auto launch = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto p = make(tag);
    if constexpr (std::is_same_v<T, bf16_t>) {
      if (f.sm90)
        return launch_counted(f.op, f.stream, f.y, f.y_bytes, f.grid, f.ordinal, &runs[0],
                              [&] { return sm90(p, f.grid, f.stream); });
    }
    xla::ffi::Error err = launch_persistent(f.op, k, f.dtype, &p, f.stream, f.ordinal, f.grid, f.y, f.y_bytes);
    if (err.success()) runs[1]++;
    return err;
  };
  return f.dtype == 0 ? launch((float*)nullptr) : f.dtype == 1 ? launch((half_t*)nullptr) : launch((bf16_t*)nullptr);
}

}  // namespace kosmos
