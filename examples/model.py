"""The example's decoder: kosmos_jax TP+SP layers plus the few pieces of math that
both the sharded model and its unsharded twin (examples/twin.py) share."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from kosmos_jax import nn as knn
from kosmos_jax.moe import MoEConfig


@dataclasses.dataclass(frozen=True)
class Config:
  vocab: int
  hidden: int
  heads: int
  layers: int
  seq: int
  mlp_mult: int = 4
  moe: bool = False
  num_experts: int = 8
  top_k: int = 2
  expert_intermediate: int = 64
  eps: float = 1e-6
  dtype: str = "float32"  # the layers' compute dtype (parameters stay fp32, as Flax's dtype=)


# ---- math shared with the twin -------------------------------------------------

def rms_norm(x, scale, eps):
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps) * scale).astype(x.dtype)


def rope(x):
  """Rotary position embedding over [b, s, heads, d] (d even)."""
  s, d = x.shape[1], x.shape[-1]
  freq = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))  # [d/2]
  ang = jnp.arange(s, dtype=jnp.float32)[:, None] * freq[None]  # [s, d/2]
  cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
  x1, x2 = x[..., 0::2], x[..., 1::2]
  return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).reshape(x.shape)


def causal_attention(q, k, v, head_dim: int):
  """q, k, v: [b, s, heads*head_dim] (any number of heads) -> same shape."""
  b, s, f = q.shape
  split = lambda t: t.reshape(b, s, f // head_dim, head_dim)
  q, k, v = rope(split(q)), rope(split(k)), split(v)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(head_dim).astype(q.dtype)
  mask = jnp.tril(jnp.ones((s, s), bool))
  probs = jax.nn.softmax(jnp.where(mask, logits, -1e30), axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, f)


def cross_entropy(logits, targets):
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))


# ---- the sharded model ---------------------------------------------------------

class Attention(nnx.Module):
  """q/k/v column-parallel (heads split over tp), attention local per rank, o row-parallel."""

  def __init__(self, cfg: Config, *, mesh, rngs):
    h, kw = cfg.hidden, dict(mesh=mesh, dp_axis="dp", dtype=jnp.dtype(cfg.dtype), rngs=rngs)
    if cfg.heads % mesh.shape["tp"]:
      raise ValueError(f"heads={cfg.heads} must be a multiple of tp={mesh.shape['tp']}")
    self.q, self.k, self.v = (knn.ColumnParallelLinear(h, h, **kw) for _ in range(3))
    self.o = knn.RowParallelLinear(h, h, **kw)
    self.mesh, self.head_dim = mesh, h // cfg.heads

  def __call__(self, x):
    spec = P("dp", None, "tp")
    local = jax.shard_map(lambda q, k, v: causal_attention(q, k, v, self.head_dim), mesh=self.mesh,
                          in_specs=(spec,) * 3, out_specs=spec)
    return self.o(local(self.q(x), self.k(x), self.v(x)))


class Block(nnx.Module):
  def __init__(self, cfg: Config, *, mesh, rngs):
    self.cfg = cfg
    self.norm1 = nnx.Param(jnp.ones((cfg.hidden,)))
    self.norm2 = nnx.Param(jnp.ones((cfg.hidden,)))
    self.attn = Attention(cfg, mesh=mesh, rngs=rngs)
    if cfg.moe:
      self.ffn = _moe(cfg, mesh=mesh, rngs=rngs)
    else:
      self.ffn = knn.ParallelMLP(cfg.hidden, cfg.mlp_mult * cfg.hidden, mesh=mesh, dp_axis="dp",
                                 dtype=jnp.dtype(cfg.dtype), rngs=rngs)

  def __call__(self, x):
    x = x + self.attn(rms_norm(x, self.norm1[...], self.cfg.eps))
    out = self.ffn(rms_norm(x, self.norm2[...], self.cfg.eps))
    aux = jnp.zeros((), jnp.float32)
    if isinstance(out, tuple):  # MoE returns (y, aux_loss)
      out, aux = out
    return x + out, aux


def moe_config(cfg: Config):
  return MoEConfig(num_experts=cfg.num_experts, top_k=cfg.top_k, hidden=cfg.hidden,
                   expert_intermediate=cfg.expert_intermediate, score="softmax",
                   norm_topk_prob=True, aux_loss_coeff=1e-2, capacity_factor=2.0)


def _moe(cfg: Config, *, mesh, rngs):
  """Experts over the tp axis: the tokens are already sequence-sharded over it."""
  return knn.MoE(moe_config(cfg), mesh=mesh, ep_axis="tp", dp_axis="dp", dtype=jnp.dtype(cfg.dtype),
                 rngs=rngs)


class Decoder(nnx.Module):
  def __init__(self, cfg: Config, *, mesh, rngs):
    self.cfg, self.mesh = cfg, mesh
    self.embed = nnx.Param(0.02 * jax.random.normal(rngs.params(), (cfg.vocab, cfg.hidden)))
    self.blocks = nnx.List([Block(cfg, mesh=mesh, rngs=rngs) for _ in range(cfg.layers)])
    self.norm = nnx.Param(jnp.ones((cfg.hidden,)))
    self.head = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (cfg.hidden, cfg.vocab)))

  def __call__(self, tokens):
    """tokens [batch, seq] -> (logits [batch, seq, vocab], aux loss)."""
    x = self.embed[...][tokens]
    x = jax.sharding.reshard(x, P("dp", "tp", None))  # sequence-parallel residual stream
    aux = jnp.zeros((), jnp.float32)
    for blk in self.blocks:
      x, a = blk(x)
      aux = aux + a
    return rms_norm(x, self.norm[...], self.cfg.eps) @ self.head[...], aux


def loss_fn(model, tokens, targets):
  logits, aux = model(tokens)
  return cross_entropy(logits, targets) + aux
