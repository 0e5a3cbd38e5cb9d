// The MoE forward's route stage (paper §3.3.1 step 1), one token at a time, as
// plain host/device code: the megakernel calls it on a row of FP32 router logits
// that its router GEMM tiles produced, and the CPU test runs the same code
// (tests/host/moe_route_plan_emu.cc). Semantics are those of the pure-JAX twin,
// kosmos_jax/reference/moe_router.py:
//   score   softmax over the E experts, or elementwise sigmoid;
//   choice  score + bias (the bias steers selection only, never the weights);
//   groups  with n_groups > 1 only the best topk_groups groups are eligible, a
//           group's score being the sum of its two best choices;
//   top-k   the k best eligible choices, best first;
//   weights the chosen experts' unbiased scores, renormalised to sum 1 when
//           norm_topk_prob, times route_scale;
//   aux     the balance loss's per-token probabilities: the scores, normalised
//           to sum 1 per token for sigmoid.
// Order and ties: (value, id) pairs rank by larger value, then by lower id, for
// experts and groups alike; this is jax.lax.top_k's order. The twin masks
// non-kept groups with -inf, which never ties with a finite choice, so
// skipping them is the same. NaN choices rank as -inf: a NaN token's outputs
// are NaN anyway, and its k indices stay valid expert ids.
// Selection is k passes over the E choices, each taking the best (value, id)
// that ranks after the previous pass's pick: O(k*E) reads and a handful of
// registers, no sort and no per-expert "taken" array.
#pragma once

#include <cmath>
#include <cstdint>

#include "kosmos/platform.h"

namespace kosmos::moe {

constexpr int kMaxExperts = 512;  // E
constexpr int kMaxGroups = 64;    // n_groups: the kept groups are one 64-bit mask

enum class Score : int { kSoftmax = 0, kSigmoid = 1 };

// One router's rule, the fields of MoEConfig that routing reads.
struct RouteConfig {
  Score score;
  int num_experts;      // E <= kMaxExperts
  int top_k;            // k <= topk_groups * (E / n_groups)
  int n_groups;         // G, divides E; 1 = no group limit, else E / G >= 2
  int topk_groups;      // groups kept, <= G
  bool norm_topk_prob;  // renormalise the k weights to sum 1
  float route_scale;    // multiplies the final weights
  bool has_bias;        // a selection-only bias [E] is given
};

// What the launcher checks before routing with c (MoEConfig checks the same
// in Python, and the bounds above): every pass of every selection finds a pick.
KOSMOS_HD inline bool route_config_ok(const RouteConfig& c) {
  const int E = c.num_experts, G = c.n_groups;
  if (E < 1 || E > kMaxExperts || G < 1 || G > kMaxGroups || E % G) return false;
  if (c.topk_groups < 1 || c.topk_groups > G || (G > 1 && E / G < 2)) return false;
  return c.top_k >= 1 && c.top_k <= c.topk_groups * (E / G) && c.route_scale > 0.f;
}

// (v, e) ranks before (bv, be): larger value first, lower id among equals.
KOSMOS_HD inline bool ranks_before(float v, int e, float bv, int be) {
  return v > bv || (v == bv && e < be);
}

// NaN ranks as -inf, so every pass still finds a valid id (see the header).
KOSMOS_HD inline float rank_key(float v) { return v == v ? v : -INFINITY; }

// The value selection ranks expert e by: its score plus its bias, if any.
KOSMOS_HD inline float choice(const float* score, const float* bias, const RouteConfig& c, int e) {
  return rank_key(c.has_bias ? score[e] + bias[e] : score[e]);
}

// Writes the token's scores score[E] from logits[E] (they may alias: the
// kernel can score in place) and returns the divisor of its aux probabilities:
// 1 for softmax, the sum of the E sigmoids otherwise. Sums run over experts in
// ascending order, so a token's scores are the same on every run.
KOSMOS_HD inline float route_scores(const float* logits, float* score, const RouteConfig& c) {
  const int E = c.num_experts;
  float sum = 0.f;
  if (c.score == Score::kSigmoid) {
    for (int e = 0; e < E; ++e) {
      score[e] = 1.f / (1.f + expf(-logits[e]));
      sum += score[e];
    }
    return sum;
  }
  float m = -INFINITY;
  for (int e = 0; e < E; ++e) m = fmaxf(m, logits[e]);
  for (int e = 0; e < E; ++e) {
    score[e] = expf(logits[e] - m);
    sum += score[e];
  }
  for (int e = 0; e < E; ++e) score[e] /= sum;
  return 1.f;
}

// Sum of group g's two best choices (a group holds E / G >= 2 experts).
KOSMOS_HD inline float group_score(const float* score, const float* bias, const RouteConfig& c, int g) {
  const int per = c.num_experts / c.n_groups;
  float a = -INFINITY, b = -INFINITY;  // best, second best
  for (int e = g * per; e < (g + 1) * per; ++e) {
    const float v = choice(score, bias, c, e);
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return rank_key(a + b);
}

// One pass of the k-pass selection: among candidates i < n that `eligible(i)`,
// the best (value(i), i) that ranks after the previous pick (prev_v, prev_i);
// -1 if none. Its value goes to *best_v, for the next pass's prev_v.
template <class Value, class Eligible>
KOSMOS_HD int pick_after(int n, const Value& value, const Eligible& eligible, float prev_v, int prev_i,
                         float* best_v) {
  int best_i = -1;
  *best_v = -INFINITY;
  for (int i = 0; i < n; ++i) {
    if (!eligible(i)) continue;
    const float v = value(i);
    if (ranks_before(prev_v, prev_i, v, i) && (best_i < 0 || ranks_before(v, i, *best_v, best_i))) {
      *best_v = v;
      best_i = i;
    }
  }
  return best_i;
}

// Bit g set: group g is eligible (bit 0, the one group, without a group limit). Group
// scores are recomputed per pass (topk_groups * E reads) rather than kept in
// a G-entry array that a GPU would put in local memory.
KOSMOS_HD inline uint64_t kept_groups(const float* score, const float* bias, const RouteConfig& c) {
  if (c.n_groups == 1) return 1;
  uint64_t kept = 0;
  float prev_v = INFINITY;
  int prev_g = -1;
  for (int pass = 0; pass < c.topk_groups; ++pass) {
    const int g = pick_after(
        c.n_groups, [&](int i) { return group_score(score, bias, c, i); }, [](int) { return true; }, prev_v,
        prev_g, &prev_v);
    kept |= 1ull << g;
    prev_g = g;
  }
  return kept;
}

// idx[k]: the k best eligible experts, best first (see the header: k passes,
// each taking the best (choice, id) ranked after the previous pick).
KOSMOS_HD inline void select_experts(const float* score, const float* bias, const RouteConfig& c,
                                     uint64_t kept, int* idx) {
  const int per = c.num_experts / c.n_groups;
  float prev_v = INFINITY;
  int prev_e = -1;
  for (int j = 0; j < c.top_k; ++j) {
    prev_e = pick_after(
        c.num_experts, [&](int e) { return choice(score, bias, c, e); },
        [&](int e) { return ((kept >> (e / per)) & 1) != 0; }, prev_v, prev_e, &prev_v);
    idx[j] = prev_e;
  }
}

// w[k]: combine weights from the unbiased scores of the chosen experts; the
// renormalising sum runs over the slots in order (slot 0 first).
KOSMOS_HD inline void combine_weights(const float* score, const int* idx, const RouteConfig& c, float* w) {
  float sum = 0.f;
  for (int j = 0; j < c.top_k; ++j) {
    w[j] = score[idx[j]];
    sum += w[j];
  }
  for (int j = 0; j < c.top_k; ++j) {
    const float g = c.norm_topk_prob ? w[j] / sum : w[j];
    w[j] = g * c.route_scale;
  }
}

// One token: logits[E] -> idx[k], w[k]; score[E] is scratch that keeps the
// token's scores for add_aux_probs (it may alias logits). Returns the aux divisor.
KOSMOS_HD inline float route_token(const float* logits, float* score, const float* bias, const RouteConfig& c,
                                   int* idx, float* w) {
  const float norm = route_scores(logits, score, c);
  select_experts(score, bias, c, kept_groups(score, bias, c), idx);
  combine_weights(score, idx, c, w);
  return norm;
}

// ---- aux-loss probabilities: a fixed summation order -----------------------
// prob_sum[e] = sum over this rank's tokens of score[e] / norm. Float addition
// does not associate, so for a bitwise-reproducible prob_sum the order is
// fixed, whichever CTA routes which token block:
//   1. the CTA routing token block b adds its tokens' probabilities into a
//      CTA-local partial[E] (zeroed first) in token order, calling
//      add_aux_probs once per token; lanes split the experts, so no two
//      threads add into the same entry and each entry sees token order;
//   2. it stores that partial as row b of partials[n_blocks, E] in global memory;
//   3. the last block to be routed sums the rows in block order (sum_partials).
// Memory: n_blocks * E floats in global memory, E floats per routing CTA.
KOSMOS_HD inline void add_aux_probs(const float* score, float norm, int num_experts, float* partial,
                                    int lane, int lanes) {
  for (int e = lane; e < num_experts; e += lanes) partial[e] += score[e] / norm;
}

// prob_sum[E] = partials[0] + partials[1] + ... in block order; lanes split experts.
KOSMOS_HD inline void sum_partials(const float* partials, int n_blocks, int num_experts, float* prob_sum,
                                   int lane, int lanes) {
  for (int e = lane; e < num_experts; e += lanes) {
    float s = 0.f;
    for (int b = 0; b < n_blocks; ++b) s += partials[(size_t)b * num_experts + e];
    prob_sum[e] = s;
  }
}

}  // namespace kosmos::moe
