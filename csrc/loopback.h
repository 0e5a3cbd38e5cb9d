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
  // Call i runs ops[i % size] (loopback_ops()) with input set (i / size) % sets:
  // the ops of one run share every rank's heap, as a training step's column-
  // and row-parallel layers do.
  std::vector<std::string> ops;
  int tp = 2;              // ranks, each its own heap, stream and launch
  int64_t rows = 0;        // local (sequence-shard) rows per rank: tn_rs's and bulk_rs_nt's rows per chunk
  int64_t K = 0, N = 0;
  int64_t m_local = 0;     // AG ops: rows per batch of the local shard (0: rows, one batch)
  int64_t cu_cap = 0;      // CTAs per rank; cu_cap * tp <= SMs, so every rank's CTAs co-reside
  int64_t knob = -1;       // movers (AG ops) or reducers (RS ops); -1: the default policy
  int64_t switching = 1;
  int64_t stage_bf16 = 0, band_rows = 1;  // tn_rs only
  // moe_forward, moe_backward (tp = ep ranks, rows = tokens per rank, K = hidden): every
  // expert of the group, top_k, the expert intermediate, input gating.
  int64_t moe_experts = 0, moe_top_k = 0, moe_inter = 0, moe_input_gating = 0;
  // Call i runs transport transports[i % size], by name ("pull", "push",
  // "push_fold"), as the FFI attribute carries it. The bulk ops have one
  // transport each (bulk_ag_nn pulls, bulk_rs_nt pushes) and run it whatever
  // the name, so a mixed ops list can cycle names for the others.
  std::vector<std::string> transports;
  int calls = 1;
  size_t heap_bytes = 0;   // per rank
  // 0 (timing, benchmarks/loopback.py): no poison, no first outputs, no compares;
  // only the launches and the wall time.
  int check = 1;
};

struct LoopbackResult {
  // first[c][r]: rank r's output bytes (bf16) of call c, for the first
  // sets * ops calls (one per (set, op) pair; the later calls repeat them): an
  // op's outputs one after the other (loopback_ops()).
  std::vector<std::vector<std::string>> first;
  // mismatches[i]: 16-bit words of call i's outputs (every rank) that differ
  // from call i % (sets * ops), the first with its set and op; 0 for those.
  std::vector<unsigned long long> mismatches;
  double seconds = 0;  // wall time of all calls, host side, one sync at the end
};

// The ops the hook runs, each with its inputs and outputs (bf16, row-major;
// rows = spec.rows, tp = spec.tp; every leading batch dim folded into rows):
//   ag_tn       x [rows, K], w [K, N]                      -> y [tp*rows, N]
//   tn_rs       x [tp*rows, K], w [K, N]                   -> y [rows, N]
//   ag_nn       dy [rows, N], w [K, N]                     -> dx [tp*rows, K], dy_g [tp*rows, N]
//   bulk_ag_nn  x [rows, K], dy [tp*rows, N], w [K, N]     -> xg [tp*rows, K], dxp [tp*rows, K]
//   bulk_rs_nt  dxp [tp*rows, K], xg [tp*rows, K], dy [tp*rows, N] -> dx [rows, K], dw [K, N]
//   moe_forward x [rows, K], indices [rows, k] int32, weights [rows, k] f32, w1 [E/tp, K, 2I],
//               w2 [E/tp, I, K] (this rank's experts)     -> y [rows, K], pair_row [rows, k] int32
//               (its y_rows and workspace are scratch; no shared expert)
//   moe_backward the same inputs, then dy [rows, K]           -> dx [rows, K], dw1 [E/tp, K, 2I],
//               dw2 [E/tp, I, K], pair_row [rows, k] int32; it must follow moe_forward in ops
//               (the same input set), whose workspace it reads
// An input may be longer than the op needs (ops of one run share input sets:
// ag_tn reads the first rows of a tn_rs x).
std::vector<std::string> loopback_ops();

// ins[s][r][j]: input j of rank r in set s, bf16 bytes, as loopback_ops() lists.
// Needs the runtime initialised on `ordinal` (kernels prepared). Returns "" or
// an error naming the rank, the call and the values.
std::string loopback_run(int ordinal, const LoopbackSpec& spec,
                         const std::vector<std::vector<std::vector<std::string>>>& ins, LoopbackResult* out);

}  // namespace kosmos
