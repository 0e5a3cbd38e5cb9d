// Test hook: one fused call's `tp` ranks run as `tp` concurrent launches on one
// GPU (loopback.cu). Plain C++ (module.cc includes it without nvcc).
//
// Why: the device protocol (flags, epochs, the ready and HeapUse handshakes,
// push writes into a peer's heap, TMA over the gather region) is the same code
// whether a peer heap is across NVLink or across the same GPU's memory; a GPU
// whose peers are withheld can still run every rank's kernel, concurrently, as
// a group does. What loopback cannot show is NVLink's speed or its ordering of
// remote writes; its timings are not transport numbers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kosmos {

struct LoopbackSpec {
  // Call i runs ops[i % size] ("ag_tn" or "tn_rs") with input set (i / size) %
  // sets: both ops in one run share every rank's heap, as a training step's
  // column- and row-parallel layers do.
  std::vector<std::string> ops;
  int tp = 2;              // ranks, each its own heap, stream and launch
  int64_t rows = 0;        // ag_tn: local rows per rank (x [rows, k]); tn_rs: rows per chunk
  int64_t K = 0, N = 0;
  int64_t cu_cap = 0;      // CTAs per rank; cu_cap * tp <= SMs, so every rank's CTAs co-reside
  int64_t knob = -1;       // movers (ag_tn) or reducers (tn_rs); -1: the default policy
  int64_t switching = 1;
  int64_t stage_bf16 = 0, band_rows = 1;  // tn_rs only
  std::vector<int> push;   // call i runs transport push[i % size] (1: push, 0: pull)
  int calls = 1;
  size_t heap_bytes = 0;   // per rank
  // 0 (timing, benchmarks/loopback.py): no poison, no first outputs, no compares;
  // only the launches and the wall time.
  int check = 1;
};

struct LoopbackResult {
  // first[c][r]: rank r's output bytes (bf16) of call c, for the first
  // sets * ops calls (one per (set, op) pair; the later calls repeat them).
  std::vector<std::vector<std::string>> first;
  // mismatches[i]: 16-bit words of call i's outputs (every rank) that differ
  // from call i % (sets * ops), the first with its set and op; 0 for those.
  std::vector<unsigned long long> mismatches;
  double seconds = 0;  // wall time of all calls, host side, one sync at the end
};

// x[s][r], w[s][r]: input set s of rank r, bf16 bytes: x [tp*rows, K] when an
// op is tn_rs (ag_tn reads its first `rows` rows), else [rows, K]; w [K, N].
// Needs the runtime initialised on `ordinal` (kernels prepared). Returns "" or
// an error naming the rank, the call and the values.
std::string loopback_run(int ordinal, const LoopbackSpec& spec, const std::vector<std::vector<std::string>>& x,
                         const std::vector<std::vector<std::string>>& w, LoopbackResult* out);

}  // namespace kosmos
