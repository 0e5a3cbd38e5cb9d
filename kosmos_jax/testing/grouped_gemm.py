"""The MoE expert GEMMs alone, for the MoE benchmark's floor (benchmarks/moe.py) and its
tests: not user API and not ops. Each FFI target (csrc/grouped_cuda.cu; the megakernels'
GEMM stages launched by themselves, kernels/moe/grouped_gemm_sm90.cuh and
grouped_bwd_sm90.cuh) runs every expert's GEMM in one launch, over rows already permuted
expert-major, each expert's segment padded to TILE_ROWS rows (padding rows zero):

  grouped_gemm(a [M, K], b [E, K, N], tile_expert)        c = a @ b[e]        (GEMM1, GEMM2)
  grouped_dgrad(a [M, K], b [E, N, K], tile_expert)       c = a @ b[e]^T      (dgrad1: dX = dh1 @ W1^T)
  grouped_swiglu_bwd(dy [M, H], w2 [E, I, H], h1 [M, 2I], tile_expert)
                                                          dh1 [M, 2I]         (dgrad2 + SwiGLU backward)
  grouped_wgrad(a [R, P], b [R, Q], expert_rb)            c [E, P, Q], c[e] = a[rows of e]^T @ b[rows of e]
                                                                              (wgrad2: act^T dY; wgrad1: X^T dh1)

tile_expert [M / TILE_ROWS] int32 is the expert of each 128-row tile; expert_rb [E + 1]
int32 the experts' row-block bounds (expert e owns rows [128 rb[e], 128 rb[e + 1])). All
operands bf16, fp32 accumulation rounded once; no attributes (one CTA per SM). Each has
an XLA twin (*_xla) computing the same product, the check of the kernel's output.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from kosmos_jax import _ext
from kosmos_jax.reference.moe import swiglu_backward

TARGET = "kosmos_grouped_gemm"
TARGETS = (TARGET, "kosmos_grouped_dgrad", "kosmos_grouped_swiglu_bwd", "kosmos_grouped_wgrad")
TILE_ROWS = 128
K_MULTIPLE, N_MULTIPLE = 64, 8  # the forward's k-block (an expert's weights start on one); TMA rows of 16 bytes
BF16 = jnp.dtype(jnp.bfloat16)
I32 = jnp.dtype(jnp.int32)


def _primitive(target: str, abstract) -> Primitive:
  p = Primitive(target)
  p.def_abstract_eval(abstract)
  mlir.register_lowering(p, lambda ctx, *args: jax.ffi.ffi_lowering(target)(ctx, *args), platform="cuda")
  return p


grouped_gemm_p = _primitive(TARGET, lambda a, b, te: a.update(shape=(a.shape[0], b.shape[2])))
grouped_dgrad_p = _primitive(TARGETS[1], lambda a, b, te: a.update(shape=(a.shape[0], b.shape[1])))
grouped_swiglu_bwd_p = _primitive(TARGETS[2], lambda dy, w2, h1, te: h1.update(shape=h1.shape))
grouped_wgrad_p = _primitive(
    TARGETS[3], lambda a, b, rb: a.update(shape=(rb.shape[0] - 1, a.shape[1], b.shape[1])))


def status() -> tuple[bool, str]:
  """(True, '') when the grouped GEMMs can run here, else (False, why not)."""
  state = _ext.available()
  if not state:
    return False, state.reason
  missing = [t for t in TARGETS if not _ext.has_target(t, "cuda")]
  if missing:
    return False, f"{', '.join(missing)} not compiled into this extension"
  return True, ""


def _dtypes(op: str, want: dict, **arrays) -> None:
  got = {k: jnp.dtype(v.dtype) for k, v in arrays.items()}
  if got != {k: jnp.dtype(want[k]) for k in arrays}:
    raise ValueError(f"{op}: dtypes {', '.join(f'{k}.dtype={v}' for k, v in got.items())} must be "
                     f"{', '.join(f'{k}: {jnp.dtype(want[k])}' for k in arrays)}")


def _tiles(op: str, m: int, tile_expert) -> None:
  if m % TILE_ROWS or tile_expert.ndim != 1 or tile_expert.shape[0] != m // TILE_ROWS:
    raise ValueError(f"{op}: M={m} must be a multiple of {TILE_ROWS}, and tile_expert.shape="
                     f"{tuple(tile_expert.shape)} must be ({m // TILE_ROWS},): one expert per tile")


def _bind(target: str, p: Primitive, *args):
  if not _ext.has_target(target, "cuda"):
    raise NotImplementedError(f"{target} is not compiled into this extension (CUDA build needed)")
  return p.bind(*args)


def check(a, b, tile_expert) -> None:
  """grouped_gemm's contract, refused before lowering with the values named."""
  if a.ndim != 2 or b.ndim != 3 or tile_expert.ndim != 1:
    raise ValueError(f"grouped_gemm: a.shape={tuple(a.shape)}, b.shape={tuple(b.shape)} and "
                     f"tile_expert.shape={tuple(tile_expert.shape)} must be [M, K], [E, K, N] and [M / {TILE_ROWS}]")
  (m, k), (_, kb, n) = a.shape, b.shape
  _dtypes("grouped_gemm", dict(a=BF16, b=BF16, tile_expert=I32), a=a, b=b, tile_expert=tile_expert)
  if k != kb or m % TILE_ROWS or k % K_MULTIPLE or n % N_MULTIPLE or tile_expert.shape[0] != m // TILE_ROWS:
    raise ValueError(f"grouped_gemm: a.shape={tuple(a.shape)}, b.shape={tuple(b.shape)}, "
                     f"tile_expert.shape={tuple(tile_expert.shape)}: K must agree and be a multiple of "
                     f"{K_MULTIPLE}, M a multiple of {TILE_ROWS}, N of {N_MULTIPLE}, and one expert per tile")


def grouped_gemm(a, b, tile_expert):
  """c [M, N] = a @ b[tile_expert[tile]] per 128-row tile, in one launch."""
  check(a, b, tile_expert)
  return _bind(TARGET, grouped_gemm_p, a, b, tile_expert)


def grouped_dgrad(a, b, tile_expert):
  """c [M, N] = a @ b[tile_expert[tile]]^T per 128-row tile (b [E, N, K]), in one launch."""
  op = "grouped_dgrad"
  if a.ndim != 2 or b.ndim != 3 or b.shape[2] != a.shape[1]:
    raise ValueError(f"{op}: a.shape={tuple(a.shape)} and b.shape={tuple(b.shape)} must be [M, K] and [E, N, K]")
  _dtypes(op, dict(a=BF16, b=BF16, tile_expert=I32), a=a, b=b, tile_expert=tile_expert)
  _tiles(op, a.shape[0], tile_expert)
  if a.shape[1] % N_MULTIPLE or b.shape[1] % N_MULTIPLE:
    raise ValueError(f"{op}: K={a.shape[1]} and N={b.shape[1]} must be multiples of {N_MULTIPLE}")
  return _bind(TARGETS[1], grouped_dgrad_p, a, b, tile_expert)


def grouped_swiglu_bwd(dy, w2, h1, tile_expert):
  """dh1 [M, 2I] (bf16) = the SwiGLU backward of da = dy @ w2[e]^T at the forward's
  pre-activations h1 [M, 2I] (gate | up), per 128-row tile, in one launch."""
  op = "grouped_swiglu_bwd"
  if dy.ndim != 2 or w2.ndim != 3 or h1.ndim != 2 or w2.shape[2] != dy.shape[1] or \
     tuple(h1.shape) != (dy.shape[0], 2 * w2.shape[1]):
    raise ValueError(f"{op}: dy.shape={tuple(dy.shape)}, w2.shape={tuple(w2.shape)}, h1.shape={tuple(h1.shape)} "
                     "must be [M, H], [E, I, H], [M, 2I]")
  _dtypes(op, dict(dy=BF16, w2=BF16, h1=BF16, tile_expert=I32), dy=dy, w2=w2, h1=h1, tile_expert=tile_expert)
  _tiles(op, dy.shape[0], tile_expert)
  if dy.shape[1] % N_MULTIPLE or w2.shape[1] % N_MULTIPLE:
    raise ValueError(f"{op}: H={dy.shape[1]} and I={w2.shape[1]} must be multiples of {N_MULTIPLE}")
  return _bind(TARGETS[2], grouped_swiglu_bwd_p, dy, w2, h1, tile_expert)


def grouped_wgrad(a, b, expert_rb):
  """c [E, P, Q] with c[e] = a[rows of e]^T @ b[rows of e] (a [R, P], b [R, Q]; expert e's
  rows [128 rb[e], 128 rb[e + 1])), summed in ascending row order, in one launch."""
  op = "grouped_wgrad"
  if a.ndim != 2 or b.ndim != 2 or expert_rb.ndim != 1 or a.shape[0] != b.shape[0] or expert_rb.shape[0] < 2:
    raise ValueError(f"{op}: a.shape={tuple(a.shape)}, b.shape={tuple(b.shape)}, expert_rb.shape="
                     f"{tuple(expert_rb.shape)} must be [R, P], [R, Q], [E + 1] with E >= 1")
  _dtypes(op, dict(a=BF16, b=BF16, expert_rb=I32), a=a, b=b, expert_rb=expert_rb)
  (r, p), q = a.shape, b.shape[1]
  if r % TILE_ROWS or p % TILE_ROWS or q % N_MULTIPLE:
    raise ValueError(f"{op}: R={r} and P={p} must be multiples of {TILE_ROWS} (row blocks; a tile is one "
                     f"expert's), Q={q} of {N_MULTIPLE}")
  return _bind(TARGETS[3], grouped_wgrad_p, a, b, expert_rb)


def balanced_tiles(rows_per_expert: int, experts: int) -> tuple[int, np.ndarray]:
  """(rows per expert padded to whole tiles, tile_expert [M / 128]) for pre-permuted,
  balanced rows: every expert has `rows_per_expert` rows, padded to 128."""
  per = -(-rows_per_expert // TILE_ROWS) * TILE_ROWS
  return per, np.repeat(np.arange(experts, dtype=np.int32), per // TILE_ROWS)


def expert_row_blocks(tile_expert, experts: int) -> np.ndarray:
  """expert_rb [E + 1] of a sorted tile_expert: expert e's tiles are [rb[e], rb[e + 1])."""
  return np.searchsorted(np.asarray(tile_expert), np.arange(experts + 1), side="left").astype(np.int32)


def _by_tile(a):
  return a.reshape(-1, TILE_ROWS, a.shape[1])


def grouped_gemm_xla(a, b, tile_expert):
  """grouped_gemm in XLA, tile by tile."""
  out = jnp.einsum("tmk,tkn->tmn", _by_tile(a), b[tile_expert], preferred_element_type=jnp.float32)
  return out.reshape(a.shape[0], b.shape[2]).astype(a.dtype)


def grouped_dgrad_xla(a, b, tile_expert):
  """grouped_dgrad in XLA, tile by tile."""
  out = jnp.einsum("tmk,tnk->tmn", _by_tile(a), b[tile_expert], preferred_element_type=jnp.float32)
  return out.reshape(a.shape[0], b.shape[1]).astype(a.dtype)


def grouped_swiglu_bwd_xla(dy, w2, h1, tile_expert):
  """grouped_swiglu_bwd in XLA: the twin's dgrad2 (reference.moe.swiglu_backward)."""
  da = jnp.einsum("tmh,tih->tmi", _by_tile(dy), w2[tile_expert], preferred_element_type=jnp.float32)
  return swiglu_backward(h1, da.reshape(dy.shape[0], w2.shape[1])).astype(h1.dtype)


def grouped_wgrad_xla(a, b, expert_rb):
  """grouped_wgrad in XLA (expert_rb concrete: numpy), expert by expert."""
  rb = np.asarray(expert_rb) * TILE_ROWS
  out = [jnp.einsum("rp,rq->pq", a[lo:hi], b[lo:hi], preferred_element_type=jnp.float32)
         for lo, hi in zip(rb[:-1], rb[1:])]
  return jnp.stack(out).astype(a.dtype)
