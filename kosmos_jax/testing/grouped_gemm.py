"""The MoE expert GEMMs alone, for the MoE benchmark's floor (benchmarks/moe.py) and its
tests: not user API and not an op. The `kosmos_grouped_gemm` FFI target
(kernels/moe/grouped_gemm_sm90.cuh, the megakernel's GEMM stage launched by itself)
computes, for rows already permuted expert-major,

  c [M, N] = a [M, K] @ b[e] for every 128-row tile of a, e = tile_expert[tile]

  a            [M, K] bf16, M a multiple of TILE_ROWS (each expert's rows padded to it)
  b            [E, K, N] bf16 (gate_up flattened to [E, h, 2I] for GEMM1, without
               its SwiGLU; down [E, I, h] for GEMM2); K % 64 == 0, N % 8 == 0
  tile_expert  [M / TILE_ROWS] int32, the expert of each tile
  c            [M, N] bf16 (no attributes: the grid is one CTA per SM)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from kosmos_jax import _ext

TARGET = "kosmos_grouped_gemm"
TILE_ROWS = 128
K_MULTIPLE, N_MULTIPLE = 64, 8  # the engine's k-block; TMA rows of 16 bytes

grouped_gemm_p = Primitive(TARGET)


def _abstract(a, b, tile_expert):
  return a.update(shape=(a.shape[0], b.shape[2]))


def _lowering(ctx, a, b, tile_expert):
  return jax.ffi.ffi_lowering(TARGET)(ctx, a, b, tile_expert)


grouped_gemm_p.def_abstract_eval(_abstract)
mlir.register_lowering(grouped_gemm_p, _lowering, platform="cuda")


def status() -> tuple[bool, str]:
  """(True, '') when the grouped GEMM can run here, else (False, why not)."""
  state = _ext.available()
  if not state:
    return False, state.reason
  if not _ext.has_target(TARGET, "cuda"):
    return False, f"{TARGET} is not compiled into this extension"
  return True, ""


def check(a, b, tile_expert) -> None:
  """The kernel's contract, refused before lowering with the values named."""
  if a.ndim != 2 or b.ndim != 3 or tile_expert.ndim != 1:
    raise ValueError(f"grouped_gemm: a.shape={tuple(a.shape)}, b.shape={tuple(b.shape)} and "
                     f"tile_expert.shape={tuple(tile_expert.shape)} must be [M, K], [E, K, N] and [M / {TILE_ROWS}]")
  (m, k), (_, kb, n) = a.shape, b.shape
  if (jnp.dtype(a.dtype), jnp.dtype(b.dtype), jnp.dtype(tile_expert.dtype)) != (
      jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.int32)):
    raise ValueError(f"grouped_gemm: a.dtype={a.dtype}, b.dtype={b.dtype}, tile_expert.dtype={tile_expert.dtype} "
                     "must be bfloat16, bfloat16, int32")
  if k != kb or m % TILE_ROWS or k % K_MULTIPLE or n % N_MULTIPLE or tile_expert.shape[0] != m // TILE_ROWS:
    raise ValueError(f"grouped_gemm: a.shape={tuple(a.shape)}, b.shape={tuple(b.shape)}, "
                     f"tile_expert.shape={tuple(tile_expert.shape)}: K must agree and be a multiple of "
                     f"{K_MULTIPLE}, M a multiple of {TILE_ROWS}, N of {N_MULTIPLE}, and one expert per tile")


def grouped_gemm(a, b, tile_expert):
  """c [M, N] = a @ b[tile_expert[tile]] per 128-row tile, in one launch."""
  check(a, b, tile_expert)
  if not _ext.has_target(TARGET, "cuda"):
    raise NotImplementedError(f"{TARGET} is not compiled into this extension (CUDA build needed)")
  return grouped_gemm_p.bind(a, b, tile_expert)


def balanced_tiles(rows_per_expert: int, experts: int) -> tuple[int, np.ndarray]:
  """(rows per expert padded to whole tiles, tile_expert [M / 128]) for pre-permuted,
  balanced rows: every expert has `rows_per_expert` rows, padded to 128."""
  per = -(-rows_per_expert // TILE_ROWS) * TILE_ROWS
  return per, np.repeat(np.arange(experts, dtype=np.int32), per // TILE_ROWS)


def grouped_gemm_xla(a, b, tile_expert):
  """The same product in XLA, tile by tile: the check of the kernel's output."""
  tiles = a.reshape(-1, TILE_ROWS, a.shape[1])
  out = jnp.einsum("tmk,tkn->tmn", tiles, b[tile_expert], preferred_element_type=jnp.float32)
  return out.reshape(a.shape[0], b.shape[2]).astype(a.dtype)
