// Device buffers, random fill, poison and comparison helpers for the
// standalone GEMM driver. Inputs are never zeros (METHOD.md): every check
// draws a fresh seed.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      exit(2);                                                                             \
    }                                                                                      \
  } while (0)

namespace bench {

__device__ inline uint32_t hash32(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Uniform in [-1, 1), rounded to bf16.
static __global__ void fill_random(__nv_bfloat16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = __float2bfloat16(hash32(seed * 0x9e3779b97f4a7c15ull + i) * (2.0f / 4294967296.0f) - 1.0f);
}

struct ErrSums {
  double diff2, ref2;
  unsigned long long nonfinite;
};

__device__ inline float as_f32(float x) { return x; }
__device__ inline float as_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

// Accumulates |out - ref|^2, |ref|^2 and the count of non-finite outputs
// (a poisoned element that was never written reads as NaN).
template <class T, class R>
__global__ void compare(const T* out, const R* ref, size_t n, ErrSums* s) {
  double d2 = 0, r2 = 0;
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float o = as_f32(out[i]), r = as_f32(ref[i]);
    if (!isfinite(o)) { ++bad; continue; }
    d2 += (double)(o - r) * (o - r);
    r2 += (double)r * r;
  }
  atomicAdd(&s->diff2, d2);
  atomicAdd(&s->ref2, r2);
  atomicAdd(&s->nonfinite, bad);
}

// Counts bytes that are no longer the 0xFF poison (writes outside C).
static __global__ void count_unpoisoned(const uint8_t* p, size_t n, unsigned long long* bad) {
  unsigned long long b = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    b += p[i] != 0xFF;
  atomicAdd(bad, b);
}

// Output buffer with poisoned guard zones on both sides, to catch stores past
// the edges of C.
struct Guarded {
  static constexpr size_t kGuard = 1 << 16;  // bytes per side
  uint8_t* base = nullptr;
  size_t bytes = 0;
  void* c() const { return base + kGuard; }
  void alloc(size_t b) { bytes = b; CK(cudaMalloc(&base, b + 2 * kGuard)); }
  void poison(cudaStream_t s) const { CK(cudaMemsetAsync(base, 0xFF, bytes + 2 * kGuard, s)); }
  unsigned long long guard_damage(cudaStream_t s) const {
    unsigned long long* d; unsigned long long h = 0;
    CK(cudaMalloc(&d, sizeof(*d))); CK(cudaMemsetAsync(d, 0, sizeof(*d), s));
    count_unpoisoned<<<64, 256, 0, s>>>(base, kGuard, d);
    count_unpoisoned<<<64, 256, 0, s>>>(base + kGuard + bytes, kGuard, d);
    CK(cudaMemcpyAsync(&h, d, sizeof(h), cudaMemcpyDeviceToHost, s)); CK(cudaStreamSynchronize(s));
    CK(cudaFree(d));
    return h;
  }
  void free() { CK(cudaFree(base)); base = nullptr; }
};

// Median ms of 20 calls of `call` on s after 3 warm-ups, each timed alone by CUDA events.
template <class Call>
double median_ms(cudaStream_t s, const Call& call) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) call();
  std::vector<float> ms(20);
  for (float& m : ms) {
    CK(cudaEventRecord(e0, s)); call(); CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1)); CK(cudaEventElapsedTime(&m, e0, e1));
  }
  CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return (double)ms[ms.size() / 2];
}

template <class T, class R>
ErrSums rel_error(const T* out, const R* ref, size_t n, cudaStream_t s) {
  ErrSums* d; ErrSums h{};
  CK(cudaMalloc(&d, sizeof(*d))); CK(cudaMemsetAsync(d, 0, sizeof(*d), s));
  compare<<<512, 256, 0, s>>>(out, ref, n, d);
  CK(cudaGetLastError());
  CK(cudaMemcpyAsync(&h, d, sizeof(h), cudaMemcpyDeviceToHost, s)); CK(cudaStreamSynchronize(s));
  CK(cudaFree(d));
  return h;
}

// A bf16 output of `bytes`, poisoned (0xFF: NaN where nothing is written) with
// guard zones, that launch(out) fills; synchronised.
template <class Launch>
Guarded poisoned_run(size_t bytes, cudaStream_t s, const Launch& launch) {
  Guarded out;
  out.alloc(bytes);
  out.poison(s);
  CK(launch(out.c()));
  CK(cudaStreamSynchronize(s));
  return out;
}

// A grouped GEMM checked on one case: `run()` twice (each a poisoned guarded
// bf16 output of n elements) against ref [n] fp32: nothing left unwritten,
// guards intact, the two runs bitwise equal, relative error under 1e-2 (an
// all-zero reference: every element exactly zero). Prints `label` and the verdict.
template <class Run>
bool check_grouped_output(const Run& run, const float* ref, size_t n, const char* label, cudaStream_t s) {
  Guarded out = run(), again = run();
  const ErrSums err = rel_error((const __nv_bfloat16*)out.c(), ref, n, s);
  std::vector<uint8_t> x(out.bytes), y(again.bytes);
  CK(cudaMemcpy(x.data(), out.c(), out.bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(y.data(), again.c(), again.bytes, cudaMemcpyDeviceToHost));
  const bool same = x == y;
  const unsigned long long guard = out.guard_damage(s);
  const double rel = err.ref2 > 0 ? std::sqrt(err.diff2 / err.ref2) : std::sqrt(err.diff2);
  const bool ok = err.nonfinite == 0 && guard == 0 && same && rel < 1e-2 && std::isfinite(rel);
  printf("check %s  rel=%.3e (tol 1e-02) unwritten=%llu guard=%llu deterministic=%d  %s\n", label, rel,
         err.nonfinite, guard, (int)same, ok ? "PASS" : "FAIL");
  fflush(stdout);
  out.free(); again.free();
  return ok;
}

}  // namespace bench
