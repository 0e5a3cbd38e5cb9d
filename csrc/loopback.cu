// Loopback test hook (loopback.h): every rank of a group on one GPU. Each rank
// gets its own zeroed heap, inputs, output and non-blocking stream; its calls
// go through the handlers' bodies (fused_run.h), the path XLA's calls take.
// Ranks synchronise only through the kernels' own flags, as separate GPUs do:
// the host enqueues call i on every stream without waiting for call i - 1.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "fused_run.h"
#include "loopback.h"
#include "moe/bwd_ws.h"
#include "moe/fwd_ws.h"
#include "runtime.h"

namespace kosmos {
namespace {

// Adds to *out the number of 16-bit words where a and b differ (bitwise, so a
// NaN left by the poison never equals a finite first output).
__global__ void count_diff_u16(const uint16_t* a, const uint16_t* b, size_t n, unsigned long long* out) {
  unsigned long long diff = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    diff += a[i] != b[i];
  if (diff) atomicAdd(out, diff);
}

struct Rank {
  cudaStream_t stream = nullptr;
  char* heap = nullptr;
  void* y = nullptr;                   // the largest output of the ops
  void* scratch = nullptr;             // outputs no one compares (the MoE ops' rows and workspaces)
  std::vector<std::vector<void*>> in;  // [set][input]
  std::vector<void*> first;            // per (set, op): the first call's output
};

// An op's inputs and outputs in bytes (loopback.h's table; bf16).
struct OpBytes {
  std::vector<size_t> in;
  size_t out = 0;
  size_t scratch = 0;
};

// The MoE ops' uncompared results, one after the other in the rank's scratch:
// the forward's y_rows [R + P, K] and workspace (the backward's residual: it
// stays there for the moe_backward call that follows), then the backward's
// dx_rows [R + P, K] and workspace.
struct MoeScratch {
  int64_t y_rows_rows;
  size_t ws_bytes, bwd_ws_bytes;
};
MoeScratch moe_scratch(const LoopbackSpec& s) {
  const int t = (int)s.rows, k = (int)s.moe_top_k, ep = s.tp, el = (int)(s.moe_experts / (s.tp > 0 ? s.tp : 1));
  const int R = moe::moe_rank_rows(t, k, ep, el), P = moe::moe_return_rows(t, k, ep, ep * el), I = (int)s.moe_inter;
  return {R + P, moe::moe_ws_layout(t, k, ep, el, (int)s.K, I, false).total,
          moe::moe_bwd_ws_layout(t, k, ep, el, (int)s.K, I, false).total};
}

OpBytes op_bytes(const LoopbackSpec& s, const std::string& op) {
  const size_t r = s.rows, K = s.K, N = s.N, tp = s.tp, e = 2;
  if (op == "ag_tn") return {{r * K * e, K * N * e}, tp * r * N * e};
  if (op == "tn_rs") return {{tp * r * K * e, K * N * e}, r * N * e};
  if (op == "ag_nn") return {{r * N * e, K * N * e}, tp * r * (K + N) * e};
  if (op == "bulk_ag_nn") return {{r * K * e, tp * r * N * e, K * N * e}, 2 * tp * r * K * e};
  if (op == "bulk_rs_nt") return {{tp * r * K * e, tp * r * K * e, tp * r * N * e}, (r * K + K * N) * e};
  if (op == "moe_forward") {
    const size_t k = s.moe_top_k, el = s.moe_experts / (tp ? tp : 1), I = s.moe_inter;
    const MoeScratch m = moe_scratch(s);
    return {{r * K * e, r * k * 4, r * k * 4, el * K * 2 * I * e, el * I * K * e}, r * K * e + r * k * 4,
            (size_t)m.y_rows_rows * K * e + m.ws_bytes};
  }
  if (op == "moe_backward") {
    const size_t k = s.moe_top_k, el = s.moe_experts / (tp ? tp : 1), I = s.moe_inter;
    const MoeScratch m = moe_scratch(s);
    return {{r * K * e, r * k * 4, r * k * 4, el * K * 2 * I * e, el * I * K * e, r * K * e},
            r * K * e + r * k * 4 + el * K * 2 * I * e + el * I * K * e,
            2 * (size_t)m.y_rows_rows * K * e + m.ws_bytes + m.bwd_ws_bytes};
  }
  return {};
}

bool known(const std::string& op) { return !op_bytes(LoopbackSpec{}, op).in.empty(); }

size_t scratch_max(const LoopbackSpec& s) {
  size_t b = 0;
  for (const auto& op : s.ops) b = std::max(b, op_bytes(s, op).scratch);
  return b;
}

size_t y_bytes(const LoopbackSpec& s, const std::string& op) { return op_bytes(s, op).out; }
size_t y_max(const LoopbackSpec& s) {
  size_t b = 0;
  for (const auto& op : s.ops) b = std::max(b, y_bytes(s, op));
  return b;
}
size_t keys(const LoopbackSpec& s, size_t sets) { return sets * s.ops.size(); }

using Inputs = std::vector<std::vector<std::vector<std::string>>>;  // [set][rank][input]

std::string check_inputs(const LoopbackSpec& s, const Inputs& ins) {
  for (size_t k = 0; k < ins.size(); ++k) {
    if ((int)ins[k].size() != s.tp)
      return "loopback: input set " + std::to_string(k) + " must hold tp=" + std::to_string(s.tp) + " ranks";
    for (const auto& op : s.ops) {
      const OpBytes b = op_bytes(s, op);
      for (int r = 0; r < s.tp; ++r) {
        if (ins[k][r].size() < b.in.size())
          return "loopback: " + op + " needs " + std::to_string(b.in.size()) + " inputs; set " + std::to_string(k) +
                 " rank " + std::to_string(r) + " has " + std::to_string(ins[k][r].size());
        for (size_t j = 0; j < b.in.size(); ++j)
          if (ins[k][r][j].size() < b.in[j])
            return "loopback: " + op + " input " + std::to_string(j) + " of set " + std::to_string(k) + " rank " +
                   std::to_string(r) + " has " + std::to_string(ins[k][r][j].size()) + " bytes, want at least " +
                   std::to_string(b.in[j]);
      }
    }
  }
  return "";
}

std::string check(const LoopbackSpec& s, int sm_count, const Inputs& ins) {
  if (s.ops.empty()) return "loopback: need at least one op";
  for (const auto& op : s.ops)
    if (!known(op)) return "loopback: unknown op '" + op + "' (loopback.h lists the ops)";
  if (s.tp < 1 || s.tp > kMaxRanks) return "loopback: tp=" + std::to_string(s.tp) + " outside 1.." + std::to_string(kMaxRanks);
  for (const auto& op : s.ops)
    if ((op == "moe_forward" || op == "moe_backward") &&
        (s.moe_top_k < 1 || s.moe_inter < 1 || s.moe_experts < 1 || s.moe_experts % s.tp))
      return "loopback: " + op + " needs moe_top_k, moe_inter >= 1 and moe_experts=" +
             std::to_string(s.moe_experts) + " a positive multiple of ep=" + std::to_string(s.tp);
  // The backward reads the workspace its forward left in the rank's scratch:
  // each moe_backward must follow a moe_forward of the same input set.
  for (size_t j = 0; j < s.ops.size(); ++j)
    if (s.ops[j] == "moe_backward" && (j == 0 || s.ops[j - 1] != "moe_forward"))
      return "loopback: moe_backward (op " + std::to_string(j) + ") must follow moe_forward in ops, whose "
             "workspace it reads";
  if (s.cu_cap < 1 || s.cu_cap * s.tp > sm_count)
    return "loopback: cu_cap=" + std::to_string(s.cu_cap) + " x tp=" + std::to_string(s.tp) + " must be in 1.." +
           std::to_string(sm_count) + " SMs, so that every rank's CTAs are resident at once";
  if (s.transports.empty() || s.calls < 1) return "loopback: need calls >= 1 and at least one transport";
  if (s.m_local < 0 || (s.m_local > 0 && s.rows % s.m_local))
    return "loopback: m_local=" + std::to_string(s.m_local) + " must divide rows=" + std::to_string(s.rows);
  if (ins.empty()) return "loopback: need at least one input set";
  if (s.check && (size_t)s.calls < keys(s, ins.size()))
    return "loopback: calls=" + std::to_string(s.calls) + " must cover every (set, op) pair: " +
           std::to_string(keys(s, ins.size()));
  return check_inputs(s, ins);
}

std::string cuda_check(cudaError_t e, const char* what) {
  return e == cudaSuccess ? "" : std::string("loopback: ") + what + ": " + cudaGetErrorString(e);
}

std::string alloc_rank(Rank& rk, const LoopbackSpec& s, const Inputs& ins, int r) {
  std::string err = cuda_check(cudaStreamCreateWithFlags(&rk.stream, cudaStreamNonBlocking), "stream");
  auto dev = [&](void** p, size_t n, const char* what) {
    if (err.empty()) err = cuda_check(cudaMalloc(p, n), what);
  };
  dev(reinterpret_cast<void**>(&rk.heap), s.heap_bytes, "heap");
  if (err.empty()) err = cuda_check(cudaMemset(rk.heap, 0, s.heap_bytes), "zeroing the heap");
  dev(&rk.y, y_max(s), "y");
  if (scratch_max(s) > 0) dev(&rk.scratch, scratch_max(s), "scratch");
  for (size_t k = 0; err.empty() && k < ins.size(); ++k) {
    rk.in.emplace_back();
    for (const std::string& a : ins[k][r]) {
      rk.in[k].push_back(nullptr);
      dev(&rk.in[k].back(), a.size(), "input");
      if (err.empty())
        err = cuda_check(cudaMemcpy(rk.in[k].back(), a.data(), a.size(), cudaMemcpyHostToDevice), "input");
    }
  }
  for (size_t c = 0; err.empty() && s.check && c < keys(s, ins.size()); ++c) {  // timing keeps no outputs
    rk.first.push_back(nullptr);
    dev(&rk.first[c], y_bytes(s, s.ops[c % s.ops.size()]), "first output");
  }
  return err;
}

void free_rank(Rank& rk) {
  if (rk.stream) cudaStreamSynchronize(rk.stream);
  for (auto& set : rk.in)
    for (void* p : set) cudaFree(p);
  for (void* p : rk.first) cudaFree(p);
  cudaFree(rk.y);
  cudaFree(rk.scratch);
  cudaFree(rk.heap);
  if (rk.stream) cudaStreamDestroy(rk.stream);
}

// One rank's launch of `op` through its handler body (fused_run.h), outputs
// one after the other in y (loopback.h's table).
xla::ffi::Error launch_op(const LoopbackSpec& s, const std::string& op, cudaStream_t stream, int ordinal,
                          const GroupInfo& g, const std::vector<void*>& in, void* y, void* scratch, Transport t) {
  const auto bf16 = xla::ffi::DataType::BF16;
  const size_t e = 2, r = s.rows, K = s.K, N = s.N, tp = s.tp;
  char* out = static_cast<char*>(y);
  const int64_t m = s.m_local > 0 ? s.m_local : s.rows;  // rows per batch of an AG op's shard
  if (op == "ag_tn")
    return ag_tn_run(stream, ordinal, g, 0,
                     AgArgs{in[0], in[1], y, tp * r * N * e, bf16, s.rows, m, s.K, s.N, s.tp, s.cu_cap, s.knob,
                            s.switching, t});
  if (op == "tn_rs")
    return tn_rs_run(stream, ordinal, g, 0,
                     RsArgs{in[0], in[1], y, r * N * e, bf16, s.rows, s.K, s.N, s.tp, s.cu_cap, s.knob, s.stage_bf16,
                            s.switching, s.band_rows, t});
  if (op == "ag_nn") {  // AgArgs in the gather's terms: rows of width N gathered, outputs of width K
    AgArgs a{in[0], in[1], y, tp * r * K * e, bf16, s.rows, m, s.N, s.K, s.tp, s.cu_cap, s.knob, s.switching, t};
    a.g_out = out + tp * r * K * e;
    a.g_bytes = tp * r * N * e;
    return ag_nn_run(stream, ordinal, g, 0, a);
  }
  if (op == "bulk_ag_nn")
    return bulk_ag_nn_run(stream, ordinal, g, 0,
                          BulkAgArgs{in[0], in[1], in[2], y, out + tp * r * K * e, tp * r * K * e, tp * r * K * e,
                                     bf16, s.rows, m, s.K, s.N, s.tp, s.cu_cap, s.knob, s.switching});
  if (op == "bulk_rs_nt")
    return bulk_rs_nt_run(stream, ordinal, g, 0,
                          BulkRsArgs{in[0], in[1], in[2], y, out + r * K * e, r * K * e, K * N * e, bf16, s.rows, s.K,
                                     s.N, s.tp, s.cu_cap, s.knob, s.switching});
  if (op == "moe_forward") {
    const MoeScratch m = moe_scratch(s);
    char* sc = static_cast<char*>(scratch);
    const MoeFwdArgs a{in[0], in[1], in[2], in[3], in[4], in[3], in[4], y, sc, out + r * K * e, nullptr,
                       sc + (size_t)m.y_rows_rows * K * e, m.ws_bytes, m.y_rows_rows, s.rows, s.K, s.moe_top_k,
                       s.moe_experts / s.tp, s.moe_inter, s.tp, false, s.moe_input_gating != 0, s.cu_cap, s.knob,
                       s.switching};
    return moe_fwd_run(stream, ordinal, g, 0, a);
  }
  if (op == "moe_backward") {
    const MoeScratch m = moe_scratch(s);
    const size_t el = s.moe_experts / s.tp, I = s.moe_inter, rows = (size_t)m.y_rows_rows * K * e;
    char* sc = static_cast<char*>(scratch);
    char* fws = sc + rows;  // the forward's workspace, left by the call before
    char* dw1 = out + r * K * e;  // dx, dw1, dw2, then pair_row: the TMA-stored dW 16-byte aligned
    char* dw2 = dw1 + el * K * 2 * I * e;
    const MoeBwdArgs a{in[5], in[1], in[2], in[3], in[4], fws, in[0], nullptr, nullptr, nullptr,
                       y, fws + m.ws_bytes, dw2 + el * I * K * e, dw1, dw2, nullptr, nullptr,
                       fws + m.ws_bytes + rows, m.ws_bytes, m.bwd_ws_bytes, m.y_rows_rows, s.rows, s.K, s.moe_top_k,
                       s.moe_experts / s.tp, s.moe_inter, s.tp, false, s.moe_input_gating != 0, s.cu_cap, s.knob,
                       s.switching};
    return moe_bwd_run(stream, ordinal, g, 0, a);
  }
  return xla::ffi::Error::InvalidArgument("loopback: no launch for op '" + op + "'");
}

// Call i of rank r: poison y, launch, then keep (the first call of its set and
// op) or compare the output, all on the rank's stream.
std::string enqueue(const LoopbackSpec& s, const std::vector<Transport>& ts, std::vector<Rank>& ranks, int ordinal,
                    int sm_count, int r, int i, unsigned long long* diff) {
  Rank& rk = ranks[r];
  const std::string& op = s.ops[i % s.ops.size()];
  const size_t k = (i / s.ops.size()) % rk.in.size(), yb = y_bytes(s, op);
  GroupInfo g;
  g.rank = r; g.row = 0; g.sm_count = sm_count; g.heap_bytes = s.heap_bytes;
  g.trace_list = r * (int)s.cu_cap;  // ranks share the device's trace lists: each gets its own
  for (int q = 0; q < s.tp; ++q) g.heaps[q] = ranks[q].heap;
  g.all_local = true;  // every rank is this GPU's
  const Transport t = ts[i % ts.size()];
  if (s.check) {
    const std::string err = cuda_check(cudaMemsetAsync(rk.y, 0xFF, yb, rk.stream), "poisoning y");
    if (!err.empty()) return err;
  }
  const xla::ffi::Error e = launch_op(s, op, rk.stream, ordinal, g, rk.in[k], rk.y, rk.scratch, t);
  if (e.failure()) return "loopback: rank " + std::to_string(r) + ", call " + std::to_string(i) + ": " + e.message();
  if (!s.check) return "";
  const size_t c = i % rk.first.size();  // the first call with this set and op
  if ((size_t)i < rk.first.size())
    return cuda_check(cudaMemcpyAsync(rk.first[c], rk.y, yb, cudaMemcpyDeviceToDevice, rk.stream), "keep");
  count_diff_u16<<<64, 256, 0, rk.stream>>>(static_cast<const uint16_t*>(rk.y),
                                            static_cast<const uint16_t*>(rk.first[c]), yb / 2, diff + i);
  return cuda_check(cudaGetLastError(), "compare");
}

std::string run_calls(const LoopbackSpec& s, const std::vector<Transport>& ts, std::vector<Rank>& ranks, int ordinal,
                      int sm_count, unsigned long long* diff, LoopbackResult* out) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string err;
  for (int i = 0; err.empty() && i < s.calls; ++i)
    for (int r = 0; err.empty() && r < s.tp; ++r) err = enqueue(s, ts, ranks, ordinal, sm_count, r, i, diff);
  // Whatever failed to enqueue, the launched calls still run to the end (or trap
  // on a timed-out wait): wait for them before reading or freeing anything.
  for (Rank& rk : ranks) {
    const std::string e = cuda_check(cudaStreamSynchronize(rk.stream), "a call failed on the device");
    if (err.empty()) err = e;
  }
  out->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!err.empty() || !s.check) return err;
  out->mismatches.assign(s.calls, 0);
  err = cuda_check(cudaMemcpy(out->mismatches.data(), diff, s.calls * sizeof(unsigned long long),
                              cudaMemcpyDeviceToHost), "mismatch counts");
  out->first.assign(ranks[0].first.size(), std::vector<std::string>(s.tp));
  for (size_t c = 0; err.empty() && c < out->first.size(); ++c)
    for (int r = 0; err.empty() && r < s.tp; ++r) {
      const size_t yb = y_bytes(s, s.ops[c % s.ops.size()]);
      out->first[c][r].resize(yb);
      err = cuda_check(cudaMemcpy(out->first[c][r].data(), ranks[r].first[c], yb, cudaMemcpyDeviceToHost),
                       "first outputs");
    }
  return err;
}

}  // namespace

std::vector<std::string> loopback_ops() {
  return {"ag_tn", "tn_rs", "ag_nn", "bulk_ag_nn", "bulk_rs_nt", "moe_forward", "moe_backward"};
}

std::string loopback_run(int ordinal, const LoopbackSpec& spec, const Inputs& ins, LoopbackResult* out) {
  DeviceEntry me;
  if (!Runtime::get().local(ordinal, &me))
    return "loopback: no runtime on device ordinal " + std::to_string(ordinal) +
           " (run kosmos_jax.runtime.init() first: it prepares the kernels)";
  std::string err = check(spec, me.sm_count, ins);
  // Each name once, before any launch; the run bodies then refuse an op's missing transports.
  std::vector<Transport> ts(spec.transports.size());
  for (size_t j = 0; err.empty() && j < ts.size(); ++j)
    err = parse_transport("loopback", spec.transports[j], kAllTransports, &ts[j]);
  if (!err.empty()) return err;
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(ordinal);
  // Load the compare kernel now: a lazy module load at its first launch would
  // wait for the device while rank 0's kernel spins on a rank whose launch the
  // same host thread has not issued yet.
  cudaFuncAttributes attr;
  err = cuda_check(cudaFuncGetAttributes(&attr, count_diff_u16), "loading the compare kernel");
  std::vector<Rank> ranks(spec.tp);
  for (int r = 0; err.empty() && r < spec.tp; ++r) err = alloc_rank(ranks[r], spec, ins, r);
  unsigned long long* diff = nullptr;
  if (err.empty()) err = cuda_check(cudaMalloc(&diff, spec.calls * sizeof(unsigned long long)), "counts");
  if (err.empty()) err = cuda_check(cudaMemset(diff, 0, spec.calls * sizeof(unsigned long long)), "counts");
  if (err.empty()) err = run_calls(spec, ts, ranks, ordinal, me.sm_count, diff, out);
  for (Rank& rk : ranks) free_rank(rk);
  cudaFree(diff);
  cudaSetDevice(prev);
  return err;
}

}  // namespace kosmos
