// Peer TMA check (issue 29, step 0): what no one-GPU test can show, since one L2
// serves every loopback rank. The push transports TMA-store tiles into a peer's
// heap and release a flag there; the pull ones TMA-load tiles from a peer's heap
// after acquiring its flag (kosmos/push.h, kosmos/pull.h, with the proxy fences
// of kosmos/proxy.h). This program runs exactly those steps between two ranks:
//   1. exact: rank a TMA-stores a patterned 64 x 64 bf16 tile into rank b's
//      buffer, and TMA-loads one from rank b's buffer; the host compares every
//      byte (both directions);
//   2. stress: both ranks at once, each with `channels` producer CTAs pushing
//      sequence-stamped tiles into the peer's slots (TMA store, fence, release
//      .sys) and `channels` consumer CTAs that acquire each slot's flag, read
//      the tile with TMA loads (odd sequence numbers) or plain loads (even),
//      check every element against its stamp, and hand the slot back by a
//      .sys release into the producer's memory (a credit).
// A wait that times out prints what it waited for and traps. Exit 0 only if
// every byte matched. `--loopback` runs both ranks on device 0 (the protocol
// only); `--devices a,b` across GPUs, with peer access enabled both ways.
// Build: nvcc -std=c++17 -O2 -arch=sm_90a -I kernels/include -o peer_tma tests/gpu/peer_tma/peer_tma.cu
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kosmos/proxy.h"
#include "kosmos/sync.h"

namespace {

using kosmos::Scope;
constexpr int kTile = 64;                      // rows = columns of a tile (uint16 = bf16 bits)
constexpr int kTileElems = kTile * kTile;      // 4096
constexpr uint32_t kTileBytes = kTileElems * 2;  // 8 KiB
constexpr int kThreads = 256;
constexpr uint64_t kTimeoutNs = 5000000000ull;

#define CHECK_CUDA(x)                                                                        \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "peer_tma: %s failed: %s\n", #x, cudaGetErrorString(e_));         \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)

// The stamp of element i of the tile that `src`'s channel `ch` sends as number `seq`:
// any stale, misplaced or torn tile differs from it somewhere.
__host__ __device__ inline uint16_t stamp(int src, int ch, uint32_t seq, int i) {
  uint32_t v = (seq * 2654435761u) ^ (uint32_t(i) * 40503u) ^ (uint32_t(ch) << 20) ^ (uint32_t(src) << 28);
  return uint16_t(v ^ (v >> 16));
}

// One rank's view: its own slots and flags, and the peer's (device pointers; with
// peer access on, the peer's are the peer GPU's memory).
struct Rank {
  int rank, channels, slots;
  uint16_t* land;        // [channels * slots * 64, 64]: where the peer's producers write
  uint64_t* landed;      // [channels * slots]: seq of the tile in each slot (written by the peer)
  uint64_t* credit;      // [channels]: last seq the peer's consumer of our channel has read
  uint64_t* peer_landed; // the peer's landed
  uint64_t* peer_credit; // the peer's credit
  unsigned long long* errors;  // [0] count, [1] first (seq << 32 | index), [2] got << 16 | want
};

__device__ inline uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ inline void tma_store(const CUtensorMap* map, const uint16_t* tile, int row) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(map), "r"(0),
               "r"(row), "r"(smem_addr(tile))
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Thread 0: the tile at `row` into shared memory; returns once it has landed.
__device__ inline void tma_load(const CUtensorMap* map, uint16_t* tile, uint64_t* bar, uint32_t& phase, int row) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(kTileBytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_addr(tile)),
      "l"(map), "r"(0), "r"(row), "r"(smem_addr(bar))
      : "memory");
  uint32_t done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(phase)
                 : "memory");
  phase ^= 1;
}

__device__ inline void note_error(unsigned long long* errors, uint32_t seq, int i, uint16_t got, uint16_t want) {
  if (atomicAdd(errors, 1ull) == 0) {
    errors[1] = (uint64_t(seq) << 32) | uint32_t(i);
    errors[2] = (uint64_t(got) << 16) | want;
  }
}

// Step 1: one CTA stores the stamp of (src, 0, seq) at `store_row` of `map` (the
// peer's buffer), then loads the tile at `load_row` of it into `out` (local).
__global__ void exact_kernel(const __grid_constant__ CUtensorMap map, int src, uint32_t seq, int store_row,
                             int load_row, uint16_t* out) {
  __shared__ alignas(128) uint16_t tile[kTileElems];
  __shared__ alignas(8) uint64_t bar;
  for (int i = threadIdx.x; i < kTileElems; i += blockDim.x) tile[i] = stamp(src, 0, seq, i);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // our generic smem writes, before TMA reads them
  __syncthreads();
  uint32_t phase = 0;
  if (threadIdx.x == 0) {
    tma_store(&map, tile, store_row);
    kosmos::fence_async_writes_to_release();
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    tma_load(&map, tile, &bar, phase, load_row);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kTileElems; i += blockDim.x) out[i] = tile[i];
}

// Producer CTA of channel ch: tiles seq = 1..iters into the peer's slot (seq-1) % slots.
__device__ void produce(const CUtensorMap* peer_map, const Rank& r, int ch, uint32_t iters, uint16_t* tile) {
  for (uint32_t seq = 1; seq <= iters; ++seq) {
    const int slot = ch * r.slots + int((seq - 1) % r.slots);
    if (threadIdx.x == 0 && seq > uint32_t(r.slots))  // the slot's previous tile has been read
      kosmos::wait_ge<Scope::kSys>(r.credit + ch, seq - r.slots, kTimeoutNs, {"peer_tma", r.rank, int(blockIdx.x), "credit", ch});
    __syncthreads();
    for (int i = threadIdx.x; i < kTileElems; i += blockDim.x) tile[i] = stamp(r.rank, ch, seq, i);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
      tma_store(peer_map, tile, slot * kTile);
      kosmos::fence_async_writes_to_release();  // complete, then ordered before the release over NVLink
      kosmos::store_release<Scope::kSys>(r.peer_landed + slot, seq);
    }
  }
}

// Consumer CTA of channel ch: the peer's tiles in our slots, checked element by element.
__device__ void consume(const CUtensorMap* own_map, const Rank& r, int ch, uint32_t iters, uint16_t* tile,
                        uint64_t* bar) {
  const int peer = 1 - r.rank;
  uint32_t phase = 0;
  for (uint32_t seq = 1; seq <= iters; ++seq) {
    const int slot = ch * r.slots + int((seq - 1) % r.slots);
    const uint16_t* src = tile;
    if (threadIdx.x == 0) {
      kosmos::wait_ge<Scope::kSys>(r.landed + slot, seq, kTimeoutNs, {"peer_tma", r.rank, int(blockIdx.x), "landed", slot});
      if (seq & 1) {  // TMA load: the consumer's proxy fence, as the transports' wait_landed_for_tma
        kosmos::fence_acquire_to_async();
        tma_load(own_map, tile, bar, phase, slot * kTile);
      }
    }
    __syncthreads();  // orders every thread's reads after thread 0's acquire (and the load)
    if (!(seq & 1)) src = r.land + size_t(slot) * kTileElems;
    for (int i = threadIdx.x; i < kTileElems; i += blockDim.x) {
      const uint16_t got = src[i], want = stamp(peer, ch, seq, i);
      if (got != want) note_error(r.errors, seq, i, got, want);
    }
    __syncthreads();  // every read of the slot done before it is handed back
    if (threadIdx.x == 0) kosmos::store_release<Scope::kSys>(r.peer_credit + ch, seq);
  }
}

// CTAs [0, channels) produce into the peer, [channels, 2 channels) consume ours.
__global__ void stress_kernel(const __grid_constant__ CUtensorMap peer_map, const __grid_constant__ CUtensorMap own_map,
                              Rank r, uint32_t iters) {
  __shared__ alignas(128) uint16_t tile[kTileElems];
  __shared__ alignas(8) uint64_t bar;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (int(blockIdx.x) < r.channels) produce(&peer_map, r, blockIdx.x, iters, tile);
  else consume(&own_map, r, blockIdx.x - r.channels, iters, tile, &bar);
}

}  // namespace

// ---- host ------------------------------------------------------------------------------
namespace {

struct Args {
  int dev[2] = {0, 1};
  bool loopback = false;
  uint32_t iters = 20000;
  int channels = 8, slots = 4;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (s == "--loopback") a.loopback = true, a.dev[1] = a.dev[0];
    else if (s == "--devices" && std::sscanf(v, "%d,%d", &a.dev[0], &a.dev[1]) == 2) ++i;
    else if (s == "--iters") a.iters = uint32_t(std::atol(v)), ++i;
    else if (s == "--channels") a.channels = std::atoi(v), ++i;
    else if (s == "--slots") a.slots = std::atoi(v), ++i;
    else {
      std::fprintf(stderr, "usage: peer_tma (--loopback | --devices A,B) [--iters N] [--channels C] [--slots S]\n");
      std::exit(2);
    }
  }
  if (!a.loopback && a.dev[0] == a.dev[1]) {
    std::fprintf(stderr, "peer_tma: --devices %d,%d names one GPU twice; use --loopback for one GPU\n", a.dev[0], a.dev[1]);
    std::exit(2);
  }
  return a;
}

// The driver's encoder through the runtime (no link against libcuda).
using EncodeTiled = decltype(&cuTensorMapEncodeTiled);
EncodeTiled encoder() {
  static EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !p) {
      std::fprintf(stderr, "peer_tma: the driver has no cuTensorMapEncodeTiled (query result %d)\n", int(q));
      std::exit(2);
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

CUtensorMap tile_map(uint16_t* base, int rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {kTile, cuuint64_t(rows)}, strides[1] = {kTile * 2};
  const cuuint32_t box[2] = {kTile, kTile}, elem[2] = {1, 1};
  const CUresult e = encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, base, dims, strides, box, elem,
                                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (e != CUDA_SUCCESS) {
    std::fprintf(stderr, "peer_tma: cuTensorMapEncodeTiled(rows=%d) failed: %d\n", rows, int(e));
    std::exit(2);
  }
  return m;
}

template <typename T>
T* alloc_zero(int dev, size_t n) {
  T* p = nullptr;
  CHECK_CUDA(cudaSetDevice(dev));
  CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
  CHECK_CUDA(cudaMemset(p, 0, n * sizeof(T)));
  return p;
}

void enable_peers(const Args& a) {
  if (a.loopback) return;
  for (int s = 0; s < 2; ++s) {
    int ok = 0;
    CHECK_CUDA(cudaDeviceCanAccessPeer(&ok, a.dev[s], a.dev[1 - s]));
    if (!ok) {
      std::fprintf(stderr, "peer_tma: device %d cannot access device %d (no peer path between them)\n", a.dev[s],
                   a.dev[1 - s]);
      std::exit(2);
    }
    CHECK_CUDA(cudaSetDevice(a.dev[s]));
    const cudaError_t e = cudaDeviceEnablePeerAccess(a.dev[1 - s], 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CHECK_CUDA(e);
    (void)cudaGetLastError();
  }
}

// First differing element of `got` against `want`, or -1.
int first_diff(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) return int(i);
  return -1;
}

// Step 1, rank s to rank 1 - s: store into slot 0 of the peer, load its slot 1.
bool exact(const Args& a, Rank* r, int s) {
  const int d = 1 - s, rows = r[d].channels * r[d].slots * kTile;
  std::vector<uint16_t> pre(kTileElems), want(kTileElems), got(kTileElems);
  for (int i = 0; i < kTileElems; ++i) pre[i] = stamp(d, 1, 99, i), want[i] = stamp(s, 0, 7, i);
  CHECK_CUDA(cudaMemcpy(r[d].land + kTileElems, pre.data(), kTileBytes, cudaMemcpyDefault));
  uint16_t* out = alloc_zero<uint16_t>(a.dev[s], kTileElems);
  const CUtensorMap map = tile_map(r[d].land, rows);
  exact_kernel<<<1, kThreads>>>(map, s, 7, 0, kTile, out);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(got.data(), r[d].land, kTileBytes, cudaMemcpyDefault));
  const int st = first_diff(got, want);
  std::printf("exact TMA store %d -> %d (devices %d -> %d): %s", s, d, a.dev[s], a.dev[d], st < 0 ? "OK\n" : "MISMATCH");
  if (st >= 0) std::printf(" at element %d: got %04x want %04x\n", st, got[st], want[st]);
  CHECK_CUDA(cudaMemcpy(got.data(), out, kTileBytes, cudaMemcpyDefault));
  const int ld = first_diff(got, pre);
  std::printf("exact TMA load %d <- %d (devices %d <- %d): %s", s, d, a.dev[s], a.dev[d], ld < 0 ? "OK\n" : "MISMATCH");
  if (ld >= 0) std::printf(" at element %d: got %04x want %04x\n", ld, got[ld], pre[ld]);
  CHECK_CUDA(cudaFree(out));
  return st < 0 && ld < 0;
}

// Step 2: both ranks at once; returns the mismatches seen.
unsigned long long stress(const Args& a, Rank* r) {
  const int rows = a.channels * a.slots * kTile;
  cudaStream_t st[2];
  cudaEvent_t t0[2], t1[2];
  for (int s = 0; s < 2; ++s) {
    CHECK_CUDA(cudaSetDevice(a.dev[s]));
    CHECK_CUDA(cudaStreamCreateWithFlags(&st[s], cudaStreamNonBlocking));
    CHECK_CUDA(cudaEventCreate(&t0[s]));
    CHECK_CUDA(cudaEventCreate(&t1[s]));
  }
  for (int s = 0; s < 2; ++s) {  // both grids are resident together (checked in main), so every wait ends
    CHECK_CUDA(cudaSetDevice(a.dev[s]));
    CHECK_CUDA(cudaEventRecord(t0[s], st[s]));
    stress_kernel<<<2 * a.channels, kThreads, 0, st[s]>>>(tile_map(r[1 - s].land, rows), tile_map(r[s].land, rows),
                                                          r[s], a.iters);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaEventRecord(t1[s], st[s]));
  }
  unsigned long long total = 0;
  for (int s = 0; s < 2; ++s) {
    CHECK_CUDA(cudaSetDevice(a.dev[s]));
    CHECK_CUDA(cudaStreamSynchronize(st[s]));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, t0[s], t1[s]));
    unsigned long long e[3];
    CHECK_CUDA(cudaMemcpy(e, r[s].errors, sizeof e, cudaMemcpyDefault));
    const double bytes = double(a.iters) * a.channels * kTileBytes;
    std::printf("stress rank %d (device %d): %u tiles x %d channels from rank %d checked, %.3f ms, %.1f GB/s each way; "
                "mismatches %llu",
                s, a.dev[s], a.iters, a.channels, 1 - s, ms, bytes / (ms * 1e6), e[0]);
    if (e[0]) std::printf(" (first: seq %llu element %llu got %04llx want %04llx)", e[1] >> 32, e[1] & 0xffffffffull,
                          e[2] >> 16, e[2] & 0xffffull);
    std::printf("\n");
    total += e[0];
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, a.dev[0]));
  if (prop.major < 9) {
    std::fprintf(stderr, "peer_tma: device %d is sm_%d%d; TMA needs sm_90 or newer\n", a.dev[0], prop.major, prop.minor);
    return 2;
  }
  const int ctas = (a.loopback ? 4 : 2) * a.channels;
  if (ctas > prop.multiProcessorCount) {
    std::fprintf(stderr, "peer_tma: %d CTAs on device %d with %d SMs could not all be resident; fewer --channels\n",
                 ctas, a.dev[0], prop.multiProcessorCount);
    return 2;
  }
  enable_peers(a);
  Rank r[2];
  const size_t slots = size_t(a.channels) * a.slots;
  for (int s = 0; s < 2; ++s)
    r[s] = Rank{s, a.channels, a.slots, alloc_zero<uint16_t>(a.dev[s], slots * kTileElems),
                alloc_zero<uint64_t>(a.dev[s], slots), alloc_zero<uint64_t>(a.dev[s], a.channels), nullptr, nullptr,
                alloc_zero<unsigned long long>(a.dev[s], 3)};
  for (int s = 0; s < 2; ++s) r[s].peer_landed = r[1 - s].landed, r[s].peer_credit = r[1 - s].credit;
  bool ok = true;
  for (int s = 0; s < 2; ++s) {
    CHECK_CUDA(cudaSetDevice(a.dev[s]));
    ok = exact(a, r, s) && ok;
  }
  for (int s = 0; s < 2; ++s) CHECK_CUDA(cudaMemset(r[s].land, 0, slots * kTileBytes));
  ok = stress(a, r) == 0 && ok;
  std::printf("peer_tma %s: %s\n", a.loopback ? "loopback" : "across GPUs", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
