"""MoE layer configuration (frozen, validated at construction) and model presets.

Every preset number is a fact read from the model's published configuration; the
source is cited beside each preset. Field names are ours; the mapping from the
Hugging Face `config.json` keys is given in each comment.

This sits with the reference twin, below `ops/`, so that the ops, their twins and the
layer all read one config without importing upward; the MoE layer package re-exports it.
"""
from __future__ import annotations

import dataclasses
import math
import numbers

SCORES = ("softmax", "sigmoid")
GATINGS = ("output", "input")

_INTS = ("num_experts", "top_k", "hidden", "expert_intermediate", "n_groups", "topk_groups")


@dataclasses.dataclass(frozen=True)
class MoEConfig:
  """One expert layer.

  num_experts: routed experts E (split evenly over the EP ranks).
  top_k: experts per token k.
  hidden: model width; expert_intermediate: routed expert width I (SwiGLU: gate_up
    is [hidden, 2, I], gate then up; down is [I, hidden]).
  score: 'softmax' (Switch/Qwen) or 'sigmoid' (DeepSeek-V3, Llama 4).
  norm_topk_prob: renormalize the k selected scores to sum to 1.
  n_groups / topk_groups: group-limited routing (experts split into n_groups
    contiguous groups; only the best topk_groups groups are eligible). 1/1 = off.
  route_scale: multiplies the final combine weights.
  use_expert_bias: a per-expert bias added to the scores for *selection only*
    (DeepSeek-V3's auxiliary-loss-free balancing); never differentiated.
  aux_loss_coeff: Switch/GShard load-balancing loss coeff * E * sum_i f_i P_i
    (exactly 0 when the coefficient is 0, whatever the inputs).
  capacity_factor: receive-buffer rows per (source rank, expert) are
    ceil(capacity_factor * t_local * k / E), capped at t_local. Overflow never
    drops tokens: the layer falls back to a dropless pass whose buffers hold the
    routed (token, expert) pairs, not experts x tokens rows (see
    kosmos_jax.reference.moe). None (or any capacity that reaches t_local) = always
    that dropless pass, which then has nothing to fall back from.
  shared_expert_intermediate: width of an always-on SwiGLU shared expert (0 = none).
  gating: where a token's combine weight g_j for its expert j applies.
    'output': y = sum_j g_j * expert_j(x) (DeepSeek-V3, Qwen, Switch).
    'input':  y = sum_j expert_j(g_j * x) (Llama 4: the expert input is scaled by
    its sigmoid score, outputs are summed unweighted). The two differ for any
    nonlinear expert, so weights trained one way are wrong the other way.
  """
  num_experts: int
  top_k: int
  hidden: int
  expert_intermediate: int
  score: str = "softmax"
  norm_topk_prob: bool = False
  n_groups: int = 1
  topk_groups: int = 1
  route_scale: float = 1.0
  use_expert_bias: bool = False
  aux_loss_coeff: float = 0.0
  capacity_factor: float | None = 2.0
  shared_expert_intermediate: int = 0
  gating: str = "output"

  def __post_init__(self):
    self._check_types()
    self._check_routing()
    if not self.route_scale > 0:
      raise ValueError(f"MoEConfig: route_scale={self.route_scale!r} must be > 0")
    if self.aux_loss_coeff < 0:
      raise ValueError(f"MoEConfig: aux_loss_coeff={self.aux_loss_coeff!r} must be >= 0")
    if self.capacity_factor is not None and self.capacity_factor < 1.0:
      # Below 1 the buffers cannot hold even perfectly balanced routing, so the
      # fallback would run on every step: a configuration error, not a policy.
      raise ValueError(f"MoEConfig: capacity_factor={self.capacity_factor!r} is too small for the "
                       "no-drop policy; use a number >= 1.0, or None for dropless buffers")
    if self.shared_expert_intermediate < 0:
      raise ValueError(f"MoEConfig: shared_expert_intermediate={self.shared_expert_intermediate!r} "
                       "must be >= 0")

  def _check_types(self):
    """TypeError for a value of the wrong kind, ValueError for a non-finite number;
    numbers are stored as plain int / float so equal configs hash alike."""
    def number(name, kind, what, optional=False):
      v = getattr(self, name)
      if optional and v is None:
        return
      if isinstance(v, bool) or not isinstance(v, kind):
        raise TypeError(f"MoEConfig: {name}={v!r} must be {what}, got {type(v).__name__}")
      if kind is numbers.Real and not math.isfinite(v):
        raise ValueError(f"MoEConfig: {name}={v!r} must be finite")
      object.__setattr__(self, name, int(v) if kind is numbers.Integral else float(v))

    for name in _INTS + ("shared_expert_intermediate",):
      number(name, numbers.Integral, "an int")
    for name in ("route_scale", "aux_loss_coeff"):
      number(name, numbers.Real, "a real number")
    number("capacity_factor", numbers.Real, "a real number or None", optional=True)
    for name in ("norm_topk_prob", "use_expert_bias"):
      if not isinstance(getattr(self, name), bool):
        raise TypeError(f"MoEConfig: {name}={getattr(self, name)!r} must be a bool")
    for name, allowed in (("score", SCORES), ("gating", GATINGS)):
      if getattr(self, name) not in allowed:
        raise ValueError(f"MoEConfig: {name}={getattr(self, name)!r} must be one of {allowed}")

  def _check_routing(self):
    for name in _INTS:
      if getattr(self, name) < 1:
        raise ValueError(f"MoEConfig: {name}={getattr(self, name)!r} must be a positive int")
    if self.top_k > self.num_experts:
      raise ValueError(f"MoEConfig: top_k={self.top_k} must be <= num_experts={self.num_experts}")
    if self.num_experts % self.n_groups:
      raise ValueError(f"MoEConfig: num_experts={self.num_experts} must be divisible by "
                       f"n_groups={self.n_groups}")
    if self.topk_groups > self.n_groups:
      raise ValueError(f"MoEConfig: topk_groups={self.topk_groups} must be <= n_groups={self.n_groups}")
    per_group = self.num_experts // self.n_groups
    if self.n_groups > 1 and per_group < 2:
      # The group score is the sum of a group's two best scores.
      raise ValueError(f"MoEConfig: group-limited routing needs >= 2 experts per group, got "
                       f"num_experts={self.num_experts} / n_groups={self.n_groups} = {per_group}")
    if self.top_k > self.topk_groups * per_group:
      raise ValueError(f"MoEConfig: top_k={self.top_k} exceeds the experts eligible after group "
                       f"selection, topk_groups={self.topk_groups} * {per_group} per group")

  def capacity(self, t_local: int) -> int:
    """Receive-buffer rows per (source rank, expert) for t_local tokens per rank."""
    if self.capacity_factor is None:
      return t_local
    # A token picks each expert at most once, so t_local rows always suffice.
    return max(1, min(t_local, math.ceil(self.capacity_factor * t_local * self.top_k / self.num_experts)))

  def replace(self, **changes) -> "MoEConfig":
    return dataclasses.replace(self, **changes)


# DeepSeek-V3: huggingface.co/deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168,
# moe_intermediate_size 2048, n_routed_experts 256, num_experts_per_tok 8, n_group 8,
# topk_group 4, scoring_func "sigmoid", topk_method "noaux_tc" (selection bias,
# e_score_correction_bias), norm_topk_prob true, routed_scaling_factor 2.5,
# n_shared_experts 1 (one expert of moe_intermediate_size, so 2048 wide);
# aux_loss_alpha 0.001 (the paper's tiny sequence-wise balance loss).
DEEPSEEK_V3 = MoEConfig(
    num_experts=256, top_k=8, hidden=7168, expert_intermediate=2048, score="sigmoid",
    norm_topk_prob=True, n_groups=8, topk_groups=4, route_scale=2.5, use_expert_bias=True,
    aux_loss_coeff=0.001, shared_expert_intermediate=2048)

# Qwen3-235B-A22B: huggingface.co/Qwen/Qwen3-235B-A22B config.json: hidden_size 4096,
# moe_intermediate_size 1536, num_experts 128, num_experts_per_tok 8,
# norm_topk_prob true, router_aux_loss_coef 0.001, no shared expert (softmax router).
QWEN3_235B_A22B = MoEConfig(
    num_experts=128, top_k=8, hidden=4096, expert_intermediate=1536, score="softmax",
    norm_topk_prob=True, aux_loss_coeff=0.001)

# Qwen3-30B-A3B: huggingface.co/Qwen/Qwen3-30B-A3B config.json: hidden_size 2048,
# moe_intermediate_size 768, num_experts 128, num_experts_per_tok 8,
# norm_topk_prob true, router_aux_loss_coef 0.001, no shared expert.
QWEN3_30B_A3B = MoEConfig(
    num_experts=128, top_k=8, hidden=2048, expert_intermediate=768, score="softmax",
    norm_topk_prob=True, aux_loss_coeff=0.001)

# Llama 4 Scout: huggingface.co/meta-llama/Llama-4-Scout-17B-16E config.json,
# text_config: hidden_size 5120, intermediate_size 8192 (routed and shared expert
# width; intermediate_size_mlp 16384 is the dense layers'), num_local_experts 16,
# num_experts_per_tok 1; the router takes the top-1 logit and gates with its
# sigmoid (unnormalized); one shared expert per MoE layer. Llama4TextMoe multiplies
# the expert *input* by that gate and sums the expert outputs unweighted: gating="input".
LLAMA4_SCOUT = MoEConfig(
    num_experts=16, top_k=1, hidden=5120, expert_intermediate=8192, score="sigmoid",
    norm_topk_prob=False, gating="input", shared_expert_intermediate=8192)

# Llama 4 Maverick: huggingface.co/meta-llama/Llama-4-Maverick-17B-128E config.json,
# text_config: hidden_size 5120, intermediate_size 8192, num_local_experts 128,
# num_experts_per_tok 1, sigmoid gate on the expert input, shared expert (MoE every
# second layer, interleave_moe_layer_step 2: irrelevant to one layer).
LLAMA4_MAVERICK = MoEConfig(
    num_experts=128, top_k=1, hidden=5120, expert_intermediate=8192, score="sigmoid",
    norm_topk_prob=False, gating="input", shared_expert_intermediate=8192)

PRESETS = {
    "deepseek-v3": DEEPSEEK_V3,
    "qwen3-235b-a22b": QWEN3_235B_A22B,
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "llama4-scout": LLAMA4_SCOUT,
    "llama4-maverick": LLAMA4_MAVERICK,
}
