// The MoE routing's expert selection rule as plain host/device code: the
// selection kernel (moe/select.cuh) and its CPU run (tests/host/moe_select_emu.cc)
// call these. The rule is the twin's (moe_router.pick) on the same scores:
// jax.lax.top_k's order, a total order on the float bits (-NaN < -inf < ... <
// -0 < +0 < ... < +inf < +NaN), the lower id first among equal bits; choices
// are score + bias in one fp32 add; with groups, a group scores the sum of its
// two best choices, reduced from +0 as jnp.sum is, and the experts of groups
// not kept become -inf candidates, as the twin masks them. (route.h ranks NaN
// as -inf, a fused router's rule; selection here matches XLA's.)
// Lanes: 32 per token; lane l holds candidates l + 32 i as order-preserving
// keys, bit i of its `avail` set while candidate l + 32 i is not yet taken. A
// pass takes the largest key over the lanes and, among the lanes offering it,
// the lowest id: the serial rule's pick, since ids are distinct.
#pragma once
#include <cstdint>
#include <cstring>

#include "kosmos/platform.h"
#include "moe/route.h"

namespace kosmos::moe {

constexpr int kSelectPerLane = kMaxExperts / 32;  // expert candidates a lane holds
constexpr int kSelectGroupsPerLane = kMaxGroups / 32;

// The float's bits as an unsigned key in the total order above.
KOSMOS_HD inline uint32_t select_key(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The twin's choice of expert e of a token's scores: score + bias, one fp32 add.
KOSMOS_HD inline float select_choice(const float* score, const float* bias, const RouteConfig& c, int e) {
  return c.has_bias ? score[e] + bias[e] : score[e];
}

// Group q's key: its two largest choices in key order, summed from +0 (ch: the
// token's E choices; a group holds per >= 2 of them).
KOSMOS_HD inline uint32_t select_group_key(const float* ch, int q, int per) {
  float a = ch[q * per], b = ch[q * per + 1];
  if (select_key(b) > select_key(a)) {
    const float x = a;
    a = b;
    b = x;
  }
  for (int e = q * per + 2; e < (q + 1) * per; ++e) {
    const float v = ch[e];
    if (select_key(v) > select_key(a)) {
      b = a;
      a = v;
    } else if (select_key(v) > select_key(b)) {
      b = v;
    }
  }
  return select_key((0.f + a) + b);
}

// Lane `lane`'s candidates of a pass over n ids: key[i] of id lane + 32 i from
// key_of(id), their bits in *avail.
template <int kN, class KeyOf>
KOSMOS_HD void select_lane_keys(int n, int lane, const KeyOf& key_of, uint32_t (&key)[kN], uint32_t* avail) {
  *avail = 0;
  for (int i = 0; i < kN; ++i) {
    const int id = lane + 32 * i;
    key[i] = id < n ? key_of(id) : 0u;
    if (id < n) *avail |= 1u << i;
  }
}

// The lane's best candidate still available: *bi = -1 when none (then *bk = 0,
// which ties at most with one real key, -NaN 0xffffffff, and never offers its id).
template <int kN>
KOSMOS_HD void select_lane_best(const uint32_t (&key)[kN], uint32_t avail, uint32_t* bk, int* bi) {
  *bk = 0;
  *bi = -1;
  for (int i = 0; i < kN; ++i)
    if (((avail >> i) & 1) && (*bi < 0 || key[i] > *bk)) *bk = key[i], *bi = i;  // strict: lower id first
}

// The lane's offer to the lanes' minimum, once `top` (the lanes' largest key) is known.
KOSMOS_HD inline uint32_t select_offer(uint32_t bk, int bi, uint32_t top, int lane) {
  return bi >= 0 && bk == top ? (uint32_t)(lane + 32 * bi) : 0xffffffffu;
}

// The pass's pick leaves its lane's candidates.
KOSMOS_HD inline void select_remove(int id, int lane, uint32_t* avail) {
  if (id % 32 == lane) *avail &= ~(1u << (id / 32));
}

// Lane `lane`'s expert candidates: every expert, -inf outside the kept groups
// (bit q of kept: group q kept).
KOSMOS_HD inline void select_expert_keys(const float* ch, const RouteConfig& c, uint64_t kept, int lane,
                                         uint32_t (&key)[kSelectPerLane], uint32_t* avail) {
  const int per = c.num_experts / c.n_groups;
  select_lane_keys(
      c.num_experts, lane,
      [&](int e) { return select_key((kept >> (e / per)) & 1 ? ch[e] : -INFINITY); }, key, avail);
}

// Lane `lane`'s group candidates (n_groups > 1).
KOSMOS_HD inline void select_group_keys(const float* ch, const RouteConfig& c, int lane,
                                        uint32_t (&key)[kSelectGroupsPerLane], uint32_t* avail) {
  const int per = c.num_experts / c.n_groups;
  select_lane_keys(c.n_groups, lane, [&](int q) { return select_group_key(ch, q, per); }, key, avail);
}

}  // namespace kosmos::moe
