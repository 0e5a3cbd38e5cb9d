// Preparation and launch of the Hopper-builder AG+GEMM kernel (sm_90a only).
#include <atomic>

#include "ag_tn_sm90.h"
#include "tp/ag_gemm_sm90.cuh"

namespace kosmos {
namespace {

// 128x256 tiles, 4 stages: the engine's wide configuration (~197 KB of smem).
using AgCfg = sm90::TileConfig<gemm::Layout::TN, 128, 256, 4>;
constexpr int kOrdinals = 64;
std::atomic<int> g_state[kOrdinals];  // 0: not prepared, 1: ready, 2: not an sm_90 device

std::string fail(const char* what, int ordinal, cudaError_t e) {
  return std::string("kosmos_ag_tn (sm90): ") + what + " on ordinal " + std::to_string(ordinal) + ": " +
         cudaGetErrorString(e);
}

}  // namespace

int ag_tn_sm90_tile_n() { return AgCfg::kBN; }

std::string ag_tn_sm90_prepare(int ordinal) {
  if (ordinal < 0 || ordinal >= kOrdinals) return "kosmos_ag_tn (sm90): ordinal out of range";
  int major = 0, minor = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal);
  if (e != cudaSuccess) return fail("device query", ordinal, e);
  if (major != 9 || minor != 0) {
    g_state[ordinal] = 2;
    return "";
  }
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(ordinal);
  auto kernel = ag_tn_sm90_kernel<AgCfg>;
  const int smem = (int)sm90::SharedStorage<AgCfg>::kLaunchBytes;
  int blocks = 0;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, AgCfg::kThreads, smem);
  cudaSetDevice(prev);
  if (e != cudaSuccess) return fail("kernel set-up", ordinal, e);
  if (blocks != 1)
    return "kosmos_ag_tn (sm90): occupancy query says " + std::to_string(blocks) + " CTAs per SM on ordinal " +
           std::to_string(ordinal) + ", need exactly 1";
  g_state[ordinal] = 1;
  return "";
}

bool ag_tn_sm90_ready(int ordinal) { return ordinal >= 0 && ordinal < kOrdinals && g_state[ordinal] == 1; }

cudaError_t ag_tn_sm90_launch(const AgParams<bf16_t>& ag, int grid, cudaStream_t stream) {
  AgSm90Params<AgCfg> p{ag, {}};
  // tp > 1: A is the gather region (every shard, own included, lands there);
  // tp == 1: x itself, nothing to gather.
  const void* a = ag.tp > 1 ? static_cast<const void*>(ag.heap[ag.rank] + kHeapDataOffset) : ag.x;
  const int M = ag.tp > 1 ? ag.tp * ag.shape.T * AgCfg::kBM : ag.rows;
  p.g = sm90::make_params<AgCfg>(gemm::Problem{a, ag.w, nullptr, M, ag.N, ag.K});
  ag_tn_sm90_kernel<AgCfg><<<grid, AgCfg::kThreads, sm90::SharedStorage<AgCfg>::kLaunchBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kosmos
