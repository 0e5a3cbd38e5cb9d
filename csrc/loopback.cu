// Loopback test hook (loopback.h): every rank of a group on one GPU. Each rank
// gets its own zeroed heap, inputs, output and non-blocking stream; its calls
// go through ag_tn_run / tn_rs_run (fused_run.h), the path XLA's calls take.
// Ranks synchronise only through the kernels' own flags, as separate GPUs do:
// the host enqueues call i on every stream without waiting for call i - 1.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "fused_run.h"
#include "loopback.h"
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
  void* y = nullptr;             // the largest output of the ops
  std::vector<void*> x, w;       // per input set
  std::vector<void*> first;      // per (set, op): the first call's output
};

bool has_rs(const LoopbackSpec& s) {
  for (const auto& op : s.ops) if (op == "tn_rs") return true;
  return false;
}
size_t x_bytes(const LoopbackSpec& s) { return (size_t)(has_rs(s) ? s.tp : 1) * s.rows * s.K * 2; }
size_t y_bytes(const LoopbackSpec& s, const std::string& op) {
  return (size_t)(op == "ag_tn" ? s.tp : 1) * s.rows * s.N * 2;
}
size_t y_max(const LoopbackSpec& s) {
  size_t b = 0;
  for (const auto& op : s.ops) b = std::max(b, y_bytes(s, op));
  return b;
}
size_t keys(const LoopbackSpec& s, size_t sets) { return sets * s.ops.size(); }

std::string check(const LoopbackSpec& s, int sm_count, const std::vector<std::vector<std::string>>& x,
                  const std::vector<std::vector<std::string>>& w) {
  if (s.ops.empty()) return "loopback: need at least one op";
  for (const auto& op : s.ops)
    if (op != "ag_tn" && op != "tn_rs") return "loopback: ops must be 'ag_tn' or 'tn_rs', not '" + op + "'";
  if (s.tp < 1 || s.tp > kMaxRanks) return "loopback: tp=" + std::to_string(s.tp) + " outside 1.." + std::to_string(kMaxRanks);
  if (s.cu_cap < 1 || s.cu_cap * s.tp > sm_count)
    return "loopback: cu_cap=" + std::to_string(s.cu_cap) + " x tp=" + std::to_string(s.tp) + " must be in 1.." +
           std::to_string(sm_count) + " SMs, so that every rank's CTAs are resident at once";
  if (s.push.empty() || s.calls < 1) return "loopback: need calls >= 1 and at least one transport";
  if (x.empty() || x.size() != w.size()) return "loopback: need as many x sets as w sets, at least one";
  if (s.check && (size_t)s.calls < keys(s, x.size()))
    return "loopback: calls=" + std::to_string(s.calls) + " must cover every (set, op) pair: " +
           std::to_string(keys(s, x.size()));
  for (size_t k = 0; k < x.size(); ++k) {
    if ((int)x[k].size() != s.tp || (int)w[k].size() != s.tp)
      return "loopback: input set " + std::to_string(k) + " must hold tp=" + std::to_string(s.tp) + " x and w";
    for (int r = 0; r < s.tp; ++r)
      if (x[k][r].size() != x_bytes(s) || w[k][r].size() != (size_t)s.K * s.N * 2)
        return "loopback: set " + std::to_string(k) + " rank " + std::to_string(r) + ": x has " +
               std::to_string(x[k][r].size()) + " bytes (want " + std::to_string(x_bytes(s)) + "), w " +
               std::to_string(w[k][r].size()) + " (want " + std::to_string(s.K * s.N * 2) + ")";
  }
  return "";
}

std::string cuda_check(cudaError_t e, const char* what) {
  return e == cudaSuccess ? "" : std::string("loopback: ") + what + ": " + cudaGetErrorString(e);
}

std::string alloc_rank(Rank& rk, const LoopbackSpec& s, const std::vector<std::vector<std::string>>& x,
                       const std::vector<std::vector<std::string>>& w, int r) {
  std::string err = cuda_check(cudaStreamCreateWithFlags(&rk.stream, cudaStreamNonBlocking), "stream");
  auto dev = [&](void** p, size_t n, const char* what) {
    if (err.empty()) err = cuda_check(cudaMalloc(p, n), what);
  };
  dev(reinterpret_cast<void**>(&rk.heap), s.heap_bytes, "heap");
  if (err.empty()) err = cuda_check(cudaMemset(rk.heap, 0, s.heap_bytes), "zeroing the heap");
  dev(&rk.y, y_max(s), "y");
  for (size_t k = 0; err.empty() && k < x.size(); ++k) {
    rk.x.push_back(nullptr); rk.w.push_back(nullptr);
    dev(&rk.x[k], x_bytes(s), "x");
    dev(&rk.w[k], w[k][r].size(), "w");
    if (err.empty()) err = cuda_check(cudaMemcpy(rk.x[k], x[k][r].data(), x_bytes(s), cudaMemcpyHostToDevice), "x");
    if (err.empty()) err = cuda_check(cudaMemcpy(rk.w[k], w[k][r].data(), w[k][r].size(), cudaMemcpyHostToDevice), "w");
  }
  for (size_t c = 0; err.empty() && s.check && c < keys(s, x.size()); ++c) {  // timing keeps no outputs
    rk.first.push_back(nullptr);
    dev(&rk.first[c], y_bytes(s, s.ops[c % s.ops.size()]), "first output");
  }
  return err;
}

void free_rank(Rank& rk) {
  if (rk.stream) cudaStreamSynchronize(rk.stream);
  for (void* p : rk.x) cudaFree(p);
  for (void* p : rk.w) cudaFree(p);
  for (void* p : rk.first) cudaFree(p);
  cudaFree(rk.y);
  cudaFree(rk.heap);
  if (rk.stream) cudaStreamDestroy(rk.stream);
}

// Call i of rank r: poison y, launch, then keep (the first call of its set and
// op) or compare the output, all on the rank's stream.
std::string enqueue(const LoopbackSpec& s, std::vector<Rank>& ranks, int ordinal, int sm_count, int r, int i,
                    unsigned long long* diff) {
  Rank& rk = ranks[r];
  const std::string& op = s.ops[i % s.ops.size()];
  const size_t k = (i / s.ops.size()) % rk.x.size(), yb = y_bytes(s, op);
  GroupInfo g;
  g.rank = r; g.row = 0; g.sm_count = sm_count; g.heap_bytes = s.heap_bytes;
  g.trace_list = r * (int)s.cu_cap;  // ranks share the device's trace lists: each gets its own
  for (int q = 0; q < s.tp; ++q) g.heaps[q] = ranks[q].heap;
  const int64_t push = s.push[i % s.push.size()];
  if (s.check) {
    const std::string err = cuda_check(cudaMemsetAsync(rk.y, 0xFF, yb, rk.stream), "poisoning y");
    if (!err.empty()) return err;
  }
  const auto bf16 = xla::ffi::DataType::BF16;
  const xla::ffi::Error e =
      op == "ag_tn"
          ? ag_tn_run(rk.stream, ordinal, g, 0,
                      AgArgs{rk.x[k], rk.w[k], rk.y, yb, bf16, s.rows, s.rows, s.K, s.N, s.tp, s.cu_cap, s.knob,
                             s.switching, push})
          : tn_rs_run(rk.stream, ordinal, g, 0,
                      RsArgs{rk.x[k], rk.w[k], rk.y, yb, bf16, s.rows, s.K, s.N, s.tp, s.cu_cap, s.knob,
                             s.stage_bf16, s.switching, s.band_rows, push});
  if (e.failure()) return "loopback: rank " + std::to_string(r) + ", call " + std::to_string(i) + ": " + e.message();
  if (!s.check) return "";
  const size_t c = i % rk.first.size();  // the first call with this set and op
  if ((size_t)i < rk.first.size())
    return cuda_check(cudaMemcpyAsync(rk.first[c], rk.y, yb, cudaMemcpyDeviceToDevice, rk.stream), "keep");
  count_diff_u16<<<64, 256, 0, rk.stream>>>(static_cast<const uint16_t*>(rk.y),
                                            static_cast<const uint16_t*>(rk.first[c]), yb / 2, diff + i);
  return cuda_check(cudaGetLastError(), "compare");
}

std::string run_calls(const LoopbackSpec& s, std::vector<Rank>& ranks, int ordinal, int sm_count,
                      unsigned long long* diff, LoopbackResult* out) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string err;
  for (int i = 0; err.empty() && i < s.calls; ++i)
    for (int r = 0; err.empty() && r < s.tp; ++r) err = enqueue(s, ranks, ordinal, sm_count, r, i, diff);
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

std::string loopback_run(int ordinal, const LoopbackSpec& spec, const std::vector<std::vector<std::string>>& x,
                         const std::vector<std::vector<std::string>>& w, LoopbackResult* out) {
  DeviceEntry me;
  if (!Runtime::get().local(ordinal, &me))
    return "loopback: no runtime on device ordinal " + std::to_string(ordinal) +
           " (run kosmos_jax.runtime.init() first: it prepares the kernels)";
  std::string err = check(spec, me.sm_count, x, w);
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
  for (int r = 0; err.empty() && r < spec.tp; ++r) err = alloc_rank(ranks[r], spec, x, w, r);
  unsigned long long* diff = nullptr;
  if (err.empty()) err = cuda_check(cudaMalloc(&diff, spec.calls * sizeof(unsigned long long)), "counts");
  if (err.empty()) err = cuda_check(cudaMemset(diff, 0, spec.calls * sizeof(unsigned long long)), "counts");
  if (err.empty()) err = run_calls(spec, ranks, ordinal, me.sm_count, diff, out);
  for (Rank& rk : ranks) free_rank(rk);
  cudaFree(diff);
  cudaSetDevice(prev);
  return err;
}

}  // namespace kosmos
