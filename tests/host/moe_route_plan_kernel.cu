// Compile check of the MoE route and plan stages as device code (run by
// tests/test_host_moe_route_plan.py with nvcc -arch=sm_90a; nothing launches
// these): one small kernel per stage, each using the headers the way the
// megakernel's CTAs will.
#include "moe/plan.h"
#include "moe/route.h"

namespace kosmos::moe {

constexpr int kBlockTokens = 128;  // tokens per routing CTA, one thread each

// logits [t, E] are scored in place; partials [n_blocks, E] (route.h's order).
__global__ void route_check_kernel(float* logits, const float* bias, RouteConfig c, int t, int* idx, float* w,
                                   float* partials) {
  __shared__ float partial[kMaxExperts];  // [E] this block's aux partial sum
  __shared__ float norm[kBlockTokens];    // [B] each token's aux divisor
  const int E = c.num_experts, first = blockIdx.x * kBlockTokens;
  for (int e = threadIdx.x; e < E; e += blockDim.x) partial[e] = 0.f;
  const int i = first + threadIdx.x;
  if (i < t) {
    float* row = logits + (size_t)i * E;
    norm[threadIdx.x] = route_token(row, row, bias, c, idx + (size_t)i * c.top_k, w + (size_t)i * c.top_k);
  }
  __syncthreads();
  for (int j = 0; j < kBlockTokens && first + j < t; ++j)
    add_aux_probs(logits + (size_t)(first + j) * E, norm[j], E, partial, threadIdx.x, blockDim.x);
  for (int e = threadIdx.x; e < E; e += blockDim.x) partials[(size_t)blockIdx.x * E + e] = partial[e];
}

__global__ void prob_sum_check_kernel(const float* partials, int n_blocks, int num_experts, float* prob_sum) {
  sum_partials(partials, n_blocks, num_experts, prob_sum, threadIdx.x, blockDim.x);
}

// One CTA per token block: (a) by its thread 0.
__global__ void plan_histogram_check_kernel(const int* indices, PlanShape s, int* hist) {
  if (threadIdx.x == 0) plan_histogram(indices, s, blockIdx.x, hist + (size_t)blockIdx.x * s.num_experts);
}

// (b), the segments and the overflow test, by one CTA.
__global__ void plan_scan_check_kernel(int* hist, PlanShape s, int* counts, int* start, int capacity, int* over) {
  plan_scan(hist, s, counts, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    plan_segments<128>(counts, s.num_experts, start);
    *over = plan_overflow(counts, s.num_experts, capacity);
  }
}

// (c), one CTA per token block, in token-major order by its thread 0.
__global__ void plan_scatter_check_kernel(const int* indices, PlanShape s, int* hist, const int* start, int* pos,
                                          int* order) {
  if (threadIdx.x == 0)
    plan_scatter(indices, s, blockIdx.x, hist + (size_t)blockIdx.x * s.num_experts, start, pos, order);
}

}  // namespace kosmos::moe
