// Once-per-device preparation shared by the Hopper-builder fused kernels
// (csrc/*_sm90.cu): raise the kernel's shared-memory limit and check that one
// CTA per SM fits. A device that is not compute capability 9.0 is not an error:
// it is recorded as not ready and the handler runs the portable builders.
// `set_mailbox` is the kernel's translation unit's set_timeout_mailbox (its
// device variable is per TU), pointed at `unit`'s records on this device.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "timeout_mailbox.h"

namespace kosmos {

constexpr int kSm90Ordinals = 64;

// Per-device state of one kernel: 0 not prepared, 1 ready, 2 not an sm_90 device.
using Sm90State = std::atomic<int>[kSm90Ordinals];

inline std::string prepare_sm90(const char* op, const void* kernel, int threads, int smem, int ordinal,
                                Sm90State& state, cudaError_t (*set_mailbox)(TimeoutRecord*), TimeoutUnit unit) {
  auto fail = [&](const char* what, cudaError_t e) {
    return std::string(op) + " (sm90): " + what + " on ordinal " + std::to_string(ordinal) + ": " +
           cudaGetErrorString(e);
  };
  if (ordinal < 0 || ordinal >= kSm90Ordinals) return std::string(op) + " (sm90): ordinal out of range";
  int major = 0, minor = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal);
  if (e != cudaSuccess) return fail("device query", e);
  if (major != 9 || minor != 0) {
    state[ordinal] = 2;
    return "";
  }
  int prev = 0, blocks = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(ordinal);
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem);
  if (TimeoutRecord* records = timeout_records(ordinal, unit); e == cudaSuccess && records != nullptr)
    e = set_mailbox(records);
  cudaSetDevice(prev);
  if (e != cudaSuccess) return fail("kernel set-up", e);
  if (blocks != 1)
    return std::string(op) + " (sm90): occupancy query says " + std::to_string(blocks) + " CTAs per SM on ordinal " +
           std::to_string(ordinal) + ", need exactly 1";
  state[ordinal] = 1;
  return "";
}

inline bool sm90_ready(const Sm90State& state, int ordinal) {
  return ordinal >= 0 && ordinal < kSm90Ordinals && state[ordinal] == 1;
}

// A kernel instantiated with and without peer code (the MoE megakernels' kPeers:
// EP = 1 launches run the one without), prepared together: the one-GPU
// instantiation first (a device that is not sm_90 stops there, state 2), ready
// when both are.
struct Sm90StatePair {
  Sm90State one, peers;
};

inline std::string prepare_sm90_pair(const char* op, const void* one, const void* peers, int threads, int smem,
                                     int ordinal, Sm90StatePair& state, cudaError_t (*set_mailbox)(TimeoutRecord*),
                                     TimeoutUnit unit) {
  if (ordinal >= 0 && ordinal < kSm90Ordinals && (state.one[ordinal] == 2 || state.peers[ordinal] != 0)) return "";
  std::string why = prepare_sm90(op, one, threads, smem, ordinal, state.one, set_mailbox, unit);
  if (!why.empty() || state.one[ordinal] != 1) return why;
  return prepare_sm90(op, peers, threads, smem, ordinal, state.peers, set_mailbox, unit);
}

inline bool sm90_ready(const Sm90StatePair& state, int ordinal) {
  return sm90_ready(state.one, ordinal) && sm90_ready(state.peers, ordinal);
}

}  // namespace kosmos
