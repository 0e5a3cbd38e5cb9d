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

// group: tile-rows per band of the swizzled order (gemm::swizzle_group), in
// cluster rows with clusters (a cluster of Cfg::kClusterM CTAs builds that many
// vertically adjacent tiles at once; the grid is a whole number of clusters).
template <class Cfg, class OutT>
__global__ void __launch_bounds__(Cfg::kThreads, 1) persistent_gemm(const __grid_constant__ Params<Cfg> p,
                                                                    int group) {
  extern __shared__ char smem_raw[];
  auto& s = shared_storage<Cfg>(smem_raw);
  gemm::NoHooks hooks;
  constexpr int kC = Cfg::kClusterM;
  const int rows = gemm::ceil_div(gemm::ceil_div(p.M, Cfg::kBM), kC);  // in cluster rows
  const gemm::SwizzledOrder order{rows, gemm::ceil_div(p.N, Cfg::kBN), group};
  if constexpr (kC == 1) {
    gemm::StaticScheduler sched(order, blockIdx.x, gridDim.x);
    TileEngine<Cfg, OutT, gemm::NoHooks>::run(p, s, sched, hooks);
  } else {
    gemm::ClusterRowScheduler sched{gemm::StaticScheduler(order, blockIdx.x / kC, gridDim.x / kC), kC,
                                    (int)cluster_ctarank()};
    TileEngine<Cfg, OutT, gemm::NoHooks>::run(p, s, sched, hooks);
  }
}

constexpr int kMaxDevices = 64;

// A launch of `grid` CTAs in clusters of Cfg::kClusterM along x.
template <class Cfg>
cudaLaunchConfig_t launch_config(int grid, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid, 1, 1);
  cfg.blockDim = dim3(Cfg::kThreads, 1, 1);
  cfg.dynamicSmemBytes = SharedStorage<Cfg>::kLaunchBytes;
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = Cfg::kClusterM;
  attr->val.clusterDim.y = attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Once per (instantiation, device): raises the kernel's dynamic shared-memory
// limit on the current device (which also loads its module there) and returns
// in *ctas the most CTAs resident at once: one per SM or, with clusters, the
// whole clusters the GPCs hold (an SM no cluster can use stays idle rather
// than queue a cluster behind a wave). Function attributes are per device, so
// the cache is too; racing first calls both set the same attribute, harmlessly.
template <class Cfg, class OutT>
cudaError_t prepare_gemm(int* ctas) {
  static std::atomic<int> cached[kMaxDevices];  // 0 until that device is set up
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if ((*ctas = cached[dev].load(std::memory_order_acquire)) != 0) return cudaSuccess;
  auto kernel = persistent_gemm<Cfg, OutT>;
  const int smem = (int)SharedStorage<Cfg>::kLaunchBytes;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(ctas, cudaDevAttrMultiProcessorCount, dev);
  if (err == cudaSuccess && Cfg::kClusterM > 1) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = launch_config<Cfg>(*ctas, nullptr, &attr);
    int clusters = 0;
    err = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
    if (err == cudaSuccess) *ctas = clusters > 0 ? clusters * Cfg::kClusterM : Cfg::kClusterM;
  }
  if (err == cudaSuccess) cached[dev].store(*ctas, std::memory_order_release);
  return err;
}

// Launches C = A . B for problem `prob` on the current device with `grid` CTAs
// (<= 0: all that are resident at once; always capped at the tile count, and
// with clusters rounded down to whole clusters), walking tiles in bands of
// `group` tile-rows (<= 0: gemm::swizzle_group's rule). `grid` is a cap the
// caller promised (a CU cap), so a grid below one cluster is refused with
// cudaErrorInvalidConfiguration rather than rounded up. Returns
// cudaErrorInvalidValue when the problem does not suit TMA (see
// unsupported()); the caller then uses the portable engine.
template <class Cfg, class OutT>
cudaError_t launch_gemm(const gemm::Problem& prob, int grid, cudaStream_t stream, int group = 0) {
  if (unsupported(prob, Cfg::kLayout)) return cudaErrorInvalidValue;
  constexpr int kC = Cfg::kClusterM;
  if (grid > 0 && grid < kC) return cudaErrorInvalidConfiguration;
  int resident = 0;
  cudaError_t err = prepare_gemm<Cfg, OutT>(&resident);
  if (err != cudaSuccess) return err;
  const Params<Cfg> p = make_params<Cfg>(prob);
  const int rows = gemm::ceil_div(gemm::ceil_div(prob.M, Cfg::kBM), kC) * kC;  // tile rows, whole clusters
  const int tiles = rows * gemm::ceil_div(prob.N, Cfg::kBN);
  if (grid <= 0 || grid > resident) grid = resident;
  grid = grid < tiles ? grid : tiles;
  grid = grid / kC > 0 ? grid / kC * kC : kC;
  if (group <= 0) group = gemm::swizzle_group(rows / kC, grid / kC, Cfg::kBM * kC, Cfg::kBN);
  if constexpr (kC == 1) {
    persistent_gemm<Cfg, OutT><<<grid, Cfg::kThreads, SharedStorage<Cfg>::kLaunchBytes, stream>>>(p, group);
    return cudaGetLastError();
  } else {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = launch_config<Cfg>(grid, stream, &attr);
    return cudaLaunchKernelEx(&cfg, persistent_gemm<Cfg, OutT>, p, group);
  }
}

}  // namespace kosmos::sm90
