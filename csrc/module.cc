// nanobind module _kosmos_ext: exposes the FFI handlers as capsules (registered by
// kosmos_jax/_ext.py) and the build facts Python needs to explain what is available.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>

#include "handlers.h"
#ifdef KOSMOS_WITH_CUDA
#include "cuda_info.h"
#include "launch.h"
#include "loopback.h"
#include "matmul.h"
#ifdef KOSMOS_WITH_CUDA
#include "trace_buf.h"
#endif
#include "runtime.h"
#endif

namespace nb = nanobind;

template <typename T>
static nb::capsule Encapsulate(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

// {target name: {platform: handler capsule}}
static nb::dict Registrations() {
  nb::dict out;
#ifdef KOSMOS_WITH_CUDA
  auto cuda = [&](const char* name, nb::capsule handler) {
    nb::dict platforms;
    platforms["CUDA"] = handler;
    out[name] = platforms;
  };
  cuda("kosmos_ag_tn", Encapsulate(kosmos_ag_tn_cuda));
  cuda("kosmos_matmul", Encapsulate(kosmos_matmul_cuda));
  cuda("kosmos_tn_rs", Encapsulate(kosmos_tn_rs_cuda));
  cuda("kosmos_ag_nn", Encapsulate(kosmos_ag_nn_cuda));
  cuda("kosmos_bulk_ag_nn", Encapsulate(kosmos_bulk_ag_nn_cuda));
  cuda("kosmos_bulk_rs_nt", Encapsulate(kosmos_bulk_rs_nt_cuda));
  cuda("kosmos_moe_forward", Encapsulate(kosmos_moe_forward_cuda));
  cuda("kosmos_moe_backward", Encapsulate(kosmos_moe_backward_cuda));
  cuda("kosmos_moe_select", Encapsulate(kosmos_moe_select_cuda));
  // Benchmark facilities (the MoE floor, both directions):
  cuda("kosmos_grouped_gemm", Encapsulate(kosmos_grouped_gemm_cuda));
  cuda("kosmos_grouped_dgrad", Encapsulate(kosmos_grouped_dgrad_cuda));
  cuda("kosmos_grouped_swiglu_bwd", Encapsulate(kosmos_grouped_swiglu_bwd_cuda));
  cuda("kosmos_grouped_wgrad", Encapsulate(kosmos_grouped_wgrad_cuda));
#endif
  return out;
}

static bool CudaBuilt() {
#ifdef KOSMOS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// (device count, error): count is -1 when the runtime could not be queried.
static std::pair<int, std::string> CudaDeviceCount() {
#ifdef KOSMOS_WITH_CUDA
  std::string error;
  int n = kosmos::cuda_device_count(&error);
  return {n, error};
#else
  return {-1, "extension built without CUDA (KOSMOS_CUDA=off or nvcc not found)"};
#endif
}

#ifdef KOSMOS_WITH_CUDA
// Allocates the symmetric heaps of these local devices (once), enables peer
// access, and prepares every persistent kernel on them; raises on failure.
static void HeapInit(const std::vector<int>& ordinals, const std::vector<int64_t>& global_ids, size_t bytes) {
  std::string err = kosmos::Runtime::get().init_local(ordinals, global_ids, bytes);
  for (size_t i = 0; err.empty() && i < ordinals.size(); ++i) err = kosmos::ag_tn_prepare(ordinals[i]);
  for (size_t i = 0; err.empty() && i < ordinals.size(); ++i) err = kosmos::tn_rs_prepare(ordinals[i]);
  for (size_t i = 0; err.empty() && i < ordinals.size(); ++i) err = kosmos::bulk_ag_nn_prepare(ordinals[i]);
  for (size_t i = 0; err.empty() && i < ordinals.size(); ++i) err = kosmos::bulk_rs_nt_prepare(ordinals[i]);
  if (!err.empty()) throw std::runtime_error("kosmos runtime: " + err);
}

static nb::bytes IpcHandle(int ordinal) {
  std::string h;
  std::string err = kosmos::Runtime::get().ipc_handle(ordinal, &h);
  if (!err.empty()) throw std::runtime_error("kosmos runtime: " + err);
  return nb::bytes(h.data(), h.size());
}

static void IpcOpen(int64_t global_id, nb::bytes handle, int local_ordinal) {
  std::string err = kosmos::Runtime::get().ipc_open(
      global_id, std::string(static_cast<const char*>(handle.data()), handle.size()), local_ordinal);
  if (!err.empty()) throw std::runtime_error("kosmos runtime: " + err);
}

// "" when device `global_id`'s heap is reachable from local `ordinal`, else why not.
static std::string Unreachable(int ordinal, int64_t global_id) {
  std::string why;
  return kosmos::Runtime::get().heap_for(ordinal, global_id, &why) ? std::string() : why;
}

// Role timelines (kosmos_jax.trace.capture): raise on failure.
static void TraceEnable(int ordinal, uint32_t cap) {
  std::string err = kosmos::trace_enable(ordinal, cap);
  if (!err.empty()) throw std::runtime_error(err);
}

static std::tuple<nb::bytes, nb::bytes, uint32_t> TraceRead(int ordinal) {
  std::string records, counts;
  uint32_t cap = 0;
  std::string err = kosmos::trace_read(ordinal, &records, &counts, &cap);
  if (!err.empty()) throw std::runtime_error(err);
  return {nb::bytes(records.data(), records.size()), nb::bytes(counts.data(), counts.size()), cap};
}

// Test hook (loopback.h): a fused call's ranks as concurrent launches on one
// GPU. ins: [set][rank][input] bf16 bytes. Returns (first [call][rank] output bytes,
// mismatches per call, seconds); raises on any error.
static std::vector<std::vector<std::vector<std::string>>> BytesGrid(const nb::list& sets) {
  std::vector<std::vector<std::vector<std::string>>> out;
  for (nb::handle set : sets) {
    out.emplace_back();
    for (nb::handle rank : nb::cast<nb::list>(set)) {
      out.back().emplace_back();
      for (nb::handle b : nb::cast<nb::list>(rank)) {
        nb::bytes by = nb::cast<nb::bytes>(b);
        out.back().back().emplace_back(static_cast<const char*>(by.data()), by.size());
      }
    }
  }
  return out;
}

static nb::tuple LoopbackRun(int ordinal, const std::vector<std::string>& ops, int tp, int64_t rows, int64_t k, int64_t n,
                             int64_t cu_cap, int64_t knob, int64_t switching, int64_t stage_bf16,
                             int64_t band_rows, const std::vector<std::string>& transports, int calls,
                             size_t heap_bytes, const nb::list& ins, int check, int64_t m_local,
                             const std::vector<int64_t>& moe) {
  kosmos::LoopbackSpec spec;
  spec.ops = ops; spec.tp = tp; spec.rows = rows; spec.K = k; spec.N = n; spec.cu_cap = cu_cap; spec.knob = knob;
  spec.switching = switching; spec.stage_bf16 = stage_bf16; spec.band_rows = band_rows; spec.transports = transports;
  spec.calls = calls; spec.heap_bytes = heap_bytes; spec.check = check; spec.m_local = m_local;
  if (moe.size() == 4)  // moe_forward / moe_backward: (experts, top_k, intermediate, input_gating)
    spec.moe_experts = moe[0], spec.moe_top_k = moe[1], spec.moe_inter = moe[2], spec.moe_input_gating = moe[3];
  kosmos::LoopbackResult res;
  const auto in = BytesGrid(ins);
  std::string err;
  {
    nb::gil_scoped_release nogil;  // the calls may run for seconds
    err = kosmos::loopback_run(ordinal, spec, in, &res);
  }
  if (!err.empty()) throw std::runtime_error(err);
  nb::list first;
  for (auto& set : res.first) {
    nb::list ranks;
    for (auto& y : set) ranks.append(nb::bytes(y.data(), y.size()));
    first.append(ranks);
  }
  return nb::make_tuple(first, res.mismatches, res.seconds);
}
#endif

NB_MODULE(_kosmos_ext, m) {
  m.def("registrations", &Registrations);
  m.def("cuda_built", &CudaBuilt);
  m.def("cuda_device_count", &CudaDeviceCount);
#ifdef KOSMOS_WITH_CUDA
  m.def("heap_init", &HeapInit);
  m.def("heap_bytes", [] { return kosmos::Runtime::get().heap_bytes(); });
  m.def("ipc_handle", &IpcHandle);
  m.def("ipc_open", &IpcOpen);
  m.def("unreachable", &Unreachable);
  m.def("mapped_ids", [] { return kosmos::Runtime::get().mapped_ids(); });
  m.def("matmul_engine_runs", &kosmos::matmul_engine_runs);  // test hook: launches per engine
  m.def("ag_tn_engine_runs", &kosmos::ag_tn_engine_runs);    // test hooks: launches per builder engine
  m.def("tn_rs_engine_runs", &kosmos::tn_rs_engine_runs);
  m.def("ag_nn_engine_runs", &kosmos::ag_nn_engine_runs);
  m.def("bulk_ag_nn_engine_runs", &kosmos::bulk_ag_nn_engine_runs);
  m.def("bulk_rs_nt_engine_runs", &kosmos::bulk_rs_nt_engine_runs);
  m.def("moe_forward_engine_runs", &kosmos::moe_forward_engine_runs);
  m.def("moe_backward_engine_runs", &kosmos::moe_backward_engine_runs);
  m.def("trace_compiled", &kosmos::trace_compiled);
  m.def("trace_enable", &TraceEnable);
  m.def("trace_disable", &kosmos::trace_disable);
  m.def("trace_read", &TraceRead);
  m.def("loopback_run", &LoopbackRun);
#endif
}
