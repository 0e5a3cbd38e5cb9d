// A whole GEMM as one persistent launch of the Hopper tile engine: one CTA
// per SM walks the L2-swizzled static tile order. This is the standalone
// `ops.matmul` kernel and the engine's test vehicle; fused kernels call
// TileEngine::run with their own scheduler and hooks instead.
#pragma once
#include <cuda_runtime.h>

#include <atomic>

#include "gemm/sm90/tile_engine.cuh"
#include "gemm/tile_order.h"

namespace kosmos::sm90 {

// group: tile-rows per band of the swizzled order (gemm::swizzle_group).
template <class Cfg, class OutT>
__global__ void __launch_bounds__(Cfg::kThreads, 1) persistent_gemm(const __grid_constant__ Params<Cfg> p,
                                                                    int group) {
  extern __shared__ char smem_raw[];
  auto& s = shared_storage<Cfg>(smem_raw);
  gemm::NoHooks hooks;
  const gemm::SwizzledOrder order{gemm::ceil_div(p.M, Cfg::kBM), gemm::ceil_div(p.N, Cfg::kBN), group};
  gemm::StaticScheduler sched(order, blockIdx.x, gridDim.x);
  TileEngine<Cfg, OutT, gemm::NoHooks>::run(p, s, sched, hooks);
}

constexpr int kMaxDevices = 64;

// Once per (kernel, device): raises kKernel's dynamic shared-memory limit to
// what Cfg's engine needs on the current device (which also loads its module
// there) and returns in *ctas the most CTAs resident at once, one per SM.
// Function attributes are per device, so the cache is too; racing first calls
// both set the same attribute, harmlessly. Every persistent Hopper kernel
// prepares through it (this GEMM's, moe/grouped_gemm_sm90.cuh's).
template <class Cfg, auto kKernel>
cudaError_t prepare_persistent(int* ctas) {
  static std::atomic<int> cached[kMaxDevices];  // 0 until that device is set up
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if ((*ctas = cached[dev].load(std::memory_order_acquire)) != 0) return cudaSuccess;
  const int smem = (int)SharedStorage<Cfg>::kLaunchBytes;
  err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(ctas, cudaDevAttrMultiProcessorCount, dev);
  if (err == cudaSuccess) cached[dev].store(*ctas, std::memory_order_release);
  return err;
}

template <class Cfg, class OutT>
cudaError_t prepare_gemm(int* ctas) {
  return prepare_persistent<Cfg, persistent_gemm<Cfg, OutT>>(ctas);
}

// Launches C = A . B for problem `prob` on the current device with `grid` CTAs
// (<= 0: all that are resident at once; always capped at the tile count),
// walking tiles in bands of `group` tile-rows (<= 0: gemm::swizzle_group's
// rule). Returns cudaErrorInvalidValue when the problem does not suit TMA (see
// unsupported()); the caller then uses the portable engine.
template <class Cfg, class OutT>
cudaError_t launch_gemm(const gemm::Problem& prob, int grid, cudaStream_t stream, int group = 0) {
  if (unsupported(prob, Cfg::kLayout)) return cudaErrorInvalidValue;
  int resident = 0;
  cudaError_t err = prepare_gemm<Cfg, OutT>(&resident);
  if (err != cudaSuccess) return err;
  const Params<Cfg> p = make_params<Cfg>(prob);
  const int rows = gemm::ceil_div(prob.M, Cfg::kBM);
  const int tiles = rows * gemm::ceil_div(prob.N, Cfg::kBN);
  if (grid <= 0 || grid > resident) grid = resident;
  grid = grid < tiles ? grid : tiles;
  if (group <= 0) group = gemm::swizzle_group(rows, grid, Cfg::kBM, Cfg::kBN);
  persistent_gemm<Cfg, OutT><<<grid, Cfg::kThreads, SharedStorage<Cfg>::kLaunchBytes, stream>>>(p, group);
  return cudaGetLastError();
}

}  // namespace kosmos::sm90
