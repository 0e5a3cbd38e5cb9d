// GPU-to-GPU transport benchmark over kernels/include/kosmos/transport.h: the same
// cta_copy16 the fused kernels use, timed as push (local -> peer), pull (peer ->
// local), both directions at once, and an N-GPU all-to-all fan-out in
// destination-minor vs destination-major item order (DESIGN.md §5: A2A pushes are
// destination-minor). Peer access is enabled between every pair (never NVLS).
//
// Usage: transport_bench [--gpus N] [--mib 1024] [--reps 7] [--threads 512] [--local 1]
// Prints markdown tables: GB/s = bytes moved / median event time of `reps` runs.
// --local 1 (one GPU is enough): the copy between two buffers of GPU 0, so
// what one CTA moves when the link is not the limit (HBM is: a
// copy reads and writes each byte, so ~half of HBM's bandwidth is the ceiling).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kosmos/transport.h"

#define CK(call)                                                                                  \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

namespace {

constexpr int kMaxGpus = 8;
constexpr size_t kItemBytes = 1u << 20;  // fan-out work item: 1 MiB to one destination

struct Opts {
  int gpus = 0;  // 0: every visible GPU
  size_t bytes = size_t(1) << 30;
  int reps = 7;
  int threads = 512;
  bool local = false;
};

struct Gpu {
  char* src = nullptr;  // `bytes`, filled with a pattern
  char* dst = nullptr;  // gpus * per_peer bytes: one region per sender
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
};

// ---- kernels -------------------------------------------------------------------
__device__ __forceinline__ uint32_t pattern(size_t i, uint32_t seed) { return (uint32_t)(i * 2654435761u) ^ seed; }

__global__ void fill(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = pattern(i, seed);
}

__global__ void count_bad(const uint32_t* p, size_t n, uint32_t seed, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    mine += p[i] != pattern(i, seed);
  if (mine) atomicAdd(bad, mine);
}

// One contiguous chunk per CTA: the pair copy (push or pull is only which pointer is remote).
template <int InFlight>
__global__ void __launch_bounds__(1024) pair_copy(char* dst, const char* src, size_t bytes) {
  const size_t chunk = (bytes / gridDim.x + 15) / 16 * 16;
  const size_t off = chunk * blockIdx.x;
  if (off < bytes) kosmos::cta_copy16<InFlight>(dst + off, src + off, (chunk < bytes - off ? chunk : bytes - off));
}

struct FanOut {
  char* dst[kMaxGpus];  // every GPU's dst buffer as mapped here
  const char* src;
  int me, gpus;
  size_t per_peer;    // bytes this GPU sends to each peer
  int items_per_peer;
  bool dest_minor;    // item i -> peer i % peers (else peer i / items_per_peer)
};

// CTAs take items in queue order (CTA b: b, b+grid, ...), so at any moment the
// CTAs work on neighbouring items: destination-minor spreads them over every
// link, destination-major piles them onto one peer at a time.
__global__ void __launch_bounds__(1024) fan_out(FanOut f) {
  const int peers = f.gpus - 1, n = peers * f.items_per_peer;
  for (int i = blockIdx.x; i < n; i += gridDim.x) {
    const int p = f.dest_minor ? i % peers : i / f.items_per_peer;
    const int c = f.dest_minor ? i / peers : i % f.items_per_peer;
    const int peer = (f.me + 1 + p) % f.gpus;
    const size_t off = (size_t)c * kItemBytes;
    const size_t len = kItemBytes < f.per_peer - off ? kItemBytes : f.per_peer - off;
    kosmos::cta_copy16(f.dst[peer] + (size_t)f.me * f.per_peer + off, f.src + (size_t)p * f.per_peer + off, len);
  }
}

// ---- host ----------------------------------------------------------------------
Opts parse(int argc, char** argv) {
  Opts o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (k == "--gpus") o.gpus = (int)v;
    else if (k == "--mib") o.bytes = (size_t)v << 20;
    else if (k == "--reps") o.reps = (int)v;
    else if (k == "--threads") o.threads = (int)v;
    else if (k == "--local") o.local = v != 0;
    else { std::fprintf(stderr, "unknown option %s\n", k.c_str()); std::exit(2); }
  }
  return o;
}

size_t per_peer(const Opts& o, int gpus) { return (o.bytes / (gpus - 1)) / kItemBytes * kItemBytes; }

std::vector<Gpu> setup(const Opts& o, int gpus) {
  std::vector<Gpu> g(gpus);
  for (int d = 0; d < gpus; ++d) {
    CK(cudaSetDevice(d));
    for (int p = 0; p < gpus; ++p) {
      if (p == d) continue;
      int can = 0;
      CK(cudaDeviceCanAccessPeer(&can, d, p));
      if (!can) { std::fprintf(stderr, "GPU %d cannot access GPU %d as a peer\n", d, p); std::exit(1); }
      cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
      else CK(e);
    }
    CK(cudaMalloc(&g[d].src, o.bytes));
    CK(cudaMalloc(&g[d].dst, gpus > 1 ? std::max(o.bytes, per_peer(o, gpus) * gpus) : o.bytes));  // 1: --local
    CK(cudaStreamCreateWithFlags(&g[d].stream, cudaStreamNonBlocking));
    CK(cudaEventCreate(&g[d].start));
    CK(cudaEventCreate(&g[d].stop));
    fill<<<1024, 256>>>(reinterpret_cast<uint32_t*>(g[d].src), o.bytes / 4, 0x9e3779b9u + d);
    CK(cudaGetLastError());
  }
  for (int d = 0; d < gpus; ++d) { CK(cudaSetDevice(d)); CK(cudaDeviceSynchronize()); }
  return g;
}

// Checks `n` bytes at dst (on GPU `on`) against GPU `from`'s src pattern at offset 0.
void verify(int on, const char* dst, size_t n, int from, const char* what) {
  CK(cudaSetDevice(on));
  unsigned long long* bad;
  CK(cudaMalloc(&bad, sizeof(*bad)));
  CK(cudaMemset(bad, 0, sizeof(*bad)));
  count_bad<<<1024, 256>>>(reinterpret_cast<const uint32_t*>(dst), n / 4, 0x9e3779b9u + from, bad);
  unsigned long long h = 0;
  CK(cudaMemcpy(&h, bad, sizeof(h), cudaMemcpyDeviceToHost));
  CK(cudaFree(bad));
  if (h) { std::fprintf(stderr, "VERIFY FAILED: %s: %llu bad words\n", what, h); std::exit(1); }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Launches `launch(d)` on every GPU in `on` at once, reps times; median ms per GPU.
template <class F>
std::vector<float> time_all(std::vector<Gpu>& g, const std::vector<int>& on, int reps, F launch) {
  std::vector<std::vector<float>> ms(on.size());
  for (int r = -1; r < reps; ++r) {  // r = -1: warm-up
    for (int d : on) { CK(cudaSetDevice(d)); CK(cudaEventRecord(g[d].start, g[d].stream)); launch(d); CK(cudaGetLastError()); CK(cudaEventRecord(g[d].stop, g[d].stream)); }
    for (size_t i = 0; i < on.size(); ++i) {
      const int d = on[i];
      CK(cudaSetDevice(d));
      CK(cudaEventSynchronize(g[d].stop));
      float t = 0;
      CK(cudaEventElapsedTime(&t, g[d].start, g[d].stop));
      if (r >= 0) ms[i].push_back(t);
    }
  }
  std::vector<float> out;
  for (auto& v : ms) out.push_back(median(v));
  return out;
}

double gbps(size_t bytes, float ms) { return bytes / (ms * 1e-3) / 1e9; }

template <int IF>
void launch_pair(Gpu& run_on, char* dst, const char* src, size_t bytes, int ctas, int threads) {
  pair_copy<IF><<<ctas, threads, 0, run_on.stream>>>(dst, src, bytes);
}

// Push and pull between GPU 0 and GPU 1, one CTA count, loads in flight IF.
template <int IF>
void pair_row(std::vector<Gpu>& g, const Opts& o, int ctas) {
  const size_t n = o.bytes;
  auto push = time_all(g, {0}, o.reps, [&](int) { launch_pair<IF>(g[0], g[1].dst, g[0].src, n, ctas, o.threads); });
  verify(1, g[1].dst, n, 0, "push 0->1");
  auto pull = time_all(g, {0}, o.reps, [&](int) { launch_pair<IF>(g[0], g[0].dst, g[1].src, n, ctas, o.threads); });
  verify(0, g[0].dst, n, 1, "pull 1->0");
  auto both = time_all(g, {0, 1}, o.reps, [&](int d) { launch_pair<IF>(g[d], g[1 - d].dst, g[d].src, n, ctas, o.threads); });
  std::printf("| %d | %d | %d | %.0f | %.0f | %.0f / %.0f |\n", ctas, o.threads, IF, gbps(n, push[0]),
              gbps(n, pull[0]), gbps(n, both[0]), gbps(n, both[1]));
}

void copy_engine_row(std::vector<Gpu>& g, const Opts& o) {
  auto ce = time_all(g, {0}, o.reps, [&](int) { CK(cudaMemcpyPeerAsync(g[1].dst, 1, g[0].src, 0, o.bytes, g[0].stream)); });
  std::printf("\ncopy engine (cudaMemcpyPeerAsync 0->1, %zu MiB): %.0f GB/s\n", o.bytes >> 20, gbps(o.bytes, ce[0]));
}

// Every GPU pushes per_peer bytes to each other GPU at once; GB/s = bytes out per GPU.
void fan_out_rows(std::vector<Gpu>& g, const Opts& o, int gpus) {
  const size_t pp = per_peer(o, gpus);
  std::vector<int> all(gpus);
  for (int d = 0; d < gpus; ++d) all[d] = d;
  std::printf("\n### all-to-all fan-out, %d GPUs, %zu MiB to each peer, %d threads\n\n", gpus, pp >> 20, o.threads);
  std::printf("| CTAs | order | slowest GPU GB/s out | mean GPU GB/s out |\n| --- | --- | --- | --- |\n");
  for (int ctas : {8, 16, 32, 64}) {
    for (bool minor : {true, false}) {
      auto ms = time_all(g, all, o.reps, [&](int d) {
        FanOut f{};
        for (int p = 0; p < gpus; ++p) f.dst[p] = g[p].dst;
        f.src = g[d].src; f.me = d; f.gpus = gpus; f.per_peer = pp;
        f.items_per_peer = (int)(pp / kItemBytes); f.dest_minor = minor;
        fan_out<<<ctas, o.threads, 0, g[d].stream>>>(f);
      });
      double slow = 1e30, sum = 0;
      for (float t : ms) { const double r = gbps(pp * (gpus - 1), t); slow = std::min(slow, r); sum += r; }
      std::printf("| %d | %s | %.0f | %.0f |\n", ctas, minor ? "destination-minor" : "destination-major", slow, sum / gpus);
    }
  }
  // Sender 1's region of GPU 0 holds what GPU 1 sent for peer slot p = gpus-1 (its peer 0).
  if (gpus == 2) verify(0, g[0].dst + pp, pp, 1, "fan-out 1->0");
}

// GPU 0 only: cta_copy16 between two of its buffers.
void local_rows(const Opts& o) {
  auto g = setup(o, 1);
  const size_t n = o.bytes;
  std::printf("| CTAs | copy | GB/s copied | GB/s per CTA |\n| --- | --- | --- | --- |\n");
  auto row = [&](int ctas, const char* what, auto launch) {
    CK(cudaMemset(g[0].dst, 0, n));
    auto ms = time_all(g, {0}, o.reps, [&](int) { launch(ctas); });
    verify(0, g[0].dst, n, 0, what);
    std::printf("| %d | %s | %.0f | %.1f |\n", ctas, what, gbps(n, ms[0]), gbps(n, ms[0]) / ctas);
  };
  for (int ctas : {1, 2, 4, 8, 16, 32}) {
    row(ctas, "cta_copy16, 8 in flight", [&](int c) { launch_pair<8>(g[0], g[0].dst, g[0].src, n, c, o.threads); });
  }
}

}  // namespace

int main(int argc, char** argv) {
  Opts o = parse(argc, argv);
  int visible = 0;
  CK(cudaGetDeviceCount(&visible));
  if (o.local) {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("# transport, local copies on GPU 0 (%s), %zu MiB, median of %d, %d threads\n\n", prop.name,
                o.bytes >> 20, o.reps, o.threads);
    local_rows(o);
    std::printf("\nTRANSPORT_BENCH_OK\n");
    return 0;
  }
  const int gpus = o.gpus ? o.gpus : std::min(visible, kMaxGpus);
  if (gpus < 2 || gpus > visible || gpus > kMaxGpus) {
    std::fprintf(stderr, "need 2..%d GPUs, asked %d, %d visible\n", kMaxGpus, gpus, visible);
    return 1;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# transport (kosmos/transport.h cta_copy16): %s x%d, %zu MiB, median of %d\n\n", prop.name, gpus,
              o.bytes >> 20, o.reps);
  auto g = setup(o, gpus);
  std::printf("| CTAs | threads | loads in flight | push 0->1 GB/s | pull 1->0 GB/s | both at once GB/s (0->1 / 1->0) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  for (int ctas : {1, 2, 4, 8, 12, 16, 24, 32}) pair_row<kosmos::kInFlight>(g, o, ctas);
  for (int ctas : {4, 8, 12, 16}) pair_row<8>(g, o, ctas);
  copy_engine_row(g, o);
  fan_out_rows(g, o, gpus);
  std::printf("\nTRANSPORT_BENCH_OK\n");
  return 0;
}
