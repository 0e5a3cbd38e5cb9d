// The MoE routing's expert selection as a small kernel of its own, beside the
// router's XLA ops (the fused forward's xla_part, kosmos_jax/ops/_fused_moe.py):
// XLA lowers jax.lax.top_k to sorts, 29 us of Qwen3-30B-A3B's 8192 tokens and
// 181 us for DeepSeek-V3's three (group top-2, top groups, top-k; benchmarks/
// RESULTS.md, MoE). The rule and the lanes' roles: moe/select.h. 32 lanes per
// token; a pass is each lane's best, the lanes' largest key, then the lowest
// id offering it (one reduction instruction each on sm_80+).
#pragma once
#include <cstdint>

#include "kosmos/platform.h"
#include "moe/select.h"

namespace kosmos::moe {

constexpr int kSelectTokensPerCta = 8;  // a 32-lane group per token
constexpr int kSelectThreads = 32 * kSelectTokensPerCta;

// The 32 lanes' largest (kMax) or smallest value, on every lane.
template <bool kMax>
KOSMOS_DEVICE uint32_t lanes_extreme(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return kMax ? __reduce_max_sync(0xffffffffu, v) : __reduce_min_sync(0xffffffffu, v);
#else
  for (int off = 16; off > 0; off >>= 1) {
    const uint32_t o = (uint32_t)lanes32_shfl((int)v, (int)(threadIdx.x % 32) ^ off);
    v = (kMax ? o > v : o < v) ? o : v;
  }
  return v;
#endif
}

// One pass: the lanes' best available candidate, taken; its id on every lane.
template <int kN>
KOSMOS_DEVICE int select_take(const uint32_t (&key)[kN], uint32_t* avail, int lane) {
  uint32_t bk;
  int bi;
  select_lane_best(key, *avail, &bk, &bi);
  const int id = (int)lanes_extreme<false>(select_offer(bk, bi, lanes_extreme<true>(bk), lane));
  select_remove(id, lane, avail);
  return id;
}

// score [t, E] fp32 (the scores XLA computed for the twin), bias [E] fp32 (read
// when c.has_bias), idx [t, k] int32 out; c passed route_config_ok.
// kSelectThreads threads, a token per 32 lanes.
__global__ void __launch_bounds__(kSelectThreads) moe_select_kernel(const float* score, const float* bias,
                                                                    RouteConfig c, int t, int* idx) {
  __shared__ float choices[kSelectTokensPerCta][kMaxExperts];
  const int g = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tok = blockIdx.x * kSelectTokensPerCta + g;
  if (tok >= t) return;  // a whole lane group: nothing below syncs the CTA
  const int E = c.num_experts;
  float* ch = choices[g];
  for (int e = lane; e < E; e += 32) ch[e] = select_choice(score + (size_t)tok * E, bias, c, e);
  lanes32_sync();
  uint64_t kept = ~0ull;
  if (c.n_groups > 1) {
    uint32_t gk[kSelectGroupsPerLane], gavail;
    select_group_keys(ch, c, lane, gk, &gavail);
    kept = 0;
    for (int pass = 0; pass < c.topk_groups; ++pass) kept |= 1ull << select_take(gk, &gavail, lane);
  }
  uint32_t key[kSelectPerLane], avail;
  select_expert_keys(ch, c, kept, lane, key, &avail);
  for (int j = 0; j < c.top_k; ++j) {
    const int e = select_take(key, &avail, lane);
    if (lane == 0) idx[(size_t)tok * c.top_k + j] = e;
  }
}

}  // namespace kosmos::moe
