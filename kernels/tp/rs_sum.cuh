// The reducers' arithmetic over contiguous spans (bulk RS || NT, tp/bulk_rs.cuh):
// out[i] = round(term_0[i] + term_1[i] + ... + term_{tp-1}[i]), the sum in fp32
// from rank 0's value, ranks in order, rounded once to T: rs_reduce_fixed's
// order term for term (tp/rs_sched.h), so the bits are a function of the data
// alone, whoever sums which span. Plain math: the caller has acquired every
// term (their flags) before it calls.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kosmos/platform.h"
#include "kosmos/transport.h"
#include "kosmos/types.h"
#include "tp/rs_sched.h"

namespace kosmos {

#ifdef KOSMOS_GPU
// One 16-byte vector of T widened into acc (first: acc = v, so a -0.0 of rank 0
// stays -0.0; else acc += v).
template <typename T>
KOSMOS_DEVICE void rs_widen_add(const Vec16& v, float* acc, bool first) {
  constexpr int kVec = kVecBytes / sizeof(T);
  T e[kVec];
  memcpy(e, &v, kVecBytes);
#pragma unroll
  for (int j = 0; j < kVec; ++j) acc[j] = first ? to_f32(e[j]) : acc[j] + to_f32(e[j]);
}

template <typename T>
KOSMOS_DEVICE Vec16 rs_narrow(const float* acc) {
  constexpr int kVec = kVecBytes / sizeof(T);
  T e[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) e[j] = from_f32<T>(acc[j]);
  Vec16 v;
  memcpy(&v, e, kVecBytes);
  return v;
}

// CTA-wide: out[0, n) = the fixed-order sum of term(r)[0, n), r = 0..tp-1
// (term(r): a const T*, read L2-only: peers and other CTAs wrote the terms in
// this launch). Where every span starts 16-byte aligned, each thread keeps
// kGroups 16-byte loads of a term in flight before it adds them (one load at a
// time leaves a reducer latency-bound: gemm_rs_sm90.cuh's reducer measured it);
// the tail, and misaligned spans whole, go element by element in the same order.
template <typename T, int kGroups, class Term>
KOSMOS_DEVICE void rs_sum_span(int tp, const Term& term, T* out, size_t n) {
  constexpr int kVec = kVecBytes / sizeof(T);
  bool aligned = reinterpret_cast<uintptr_t>(out) % kVecBytes == 0;
  for (int r = 0; r < tp; ++r) aligned = aligned && reinterpret_cast<uintptr_t>(term(r)) % kVecBytes == 0;
  const size_t nvec = aligned ? n / kVec : 0;
  const size_t step = (size_t)blockDim.x * kGroups;
  for (size_t base = threadIdx.x; base < nvec; base += step) {
    float acc[kGroups][kVec];
    for (int r = 0; r < tp; ++r) {
      const Vec16* src = reinterpret_cast<const Vec16*>(term(r));
      Vec16 v[kGroups] = {};
#pragma unroll
      for (int u = 0; u < kGroups; ++u)
        if (base + (size_t)u * blockDim.x < nvec) v[u] = load_cg(src + base + (size_t)u * blockDim.x);
#pragma unroll
      for (int u = 0; u < kGroups; ++u) rs_widen_add<T>(v[u], acc[u], r == 0);
    }
#pragma unroll
    for (int u = 0; u < kGroups; ++u)
      if (base + (size_t)u * blockDim.x < nvec)
        reinterpret_cast<Vec16*>(out)[base + (size_t)u * blockDim.x] = rs_narrow<T>(acc[u]);
  }
  const size_t done = nvec * kVec;  // n < 2^32: a band's elements (tp/bulk_rs_sched.h)
  auto src = [&](int r, uint32_t i) { return to_f32(load_cg_elem(term(r) + done + i)); };
  auto dst = [&](uint32_t i, float sum) { out[done + i] = from_f32<T>(sum); };
  rs_reduce_fixed(tp, (uint32_t)(n - done), threadIdx.x, blockDim.x, src, dst);
}
#endif  // KOSMOS_GPU

}  // namespace kosmos
