"""Kernel knobs, as frozen dataclasses validated on construction (errors name the
values). Defaults come from closed-form policies in the device code
(kernels/include/kosmos/roles.h) when a knob is left as None."""
from __future__ import annotations

import dataclasses
import os

DEFAULT_HEAP_MB = 1024
MIN_HEAP_MB = 17  # kernels/tp/ag_layout.h: data starts at 16 MiB


@dataclasses.dataclass(frozen=True)
class AgConfig:
  """Fused AG+GEMM launch knobs.

  cu_cap: at most this many CTAs (= SMs), None for all SMs (paper §3.1.2).
  movers: CTAs that start as movers; None = about one in eight; 0 = all builders
    (each moves the rows it needs itself).
  """
  cu_cap: int | None = None
  movers: int | None = None

  def __post_init__(self):
    if self.cu_cap is not None and (not isinstance(self.cu_cap, int) or self.cu_cap < 1):
      raise ValueError(f"AgConfig: cu_cap={self.cu_cap!r} must be a positive int or None")
    if self.movers is not None and (not isinstance(self.movers, int) or self.movers < 0):
      raise ValueError(f"AgConfig: movers={self.movers!r} must be a non-negative int or None")


def heap_mb_from_env() -> int:
  raw = os.environ.get("KOSMOS_HEAP_MB", "").strip()
  if not raw:
    return DEFAULT_HEAP_MB
  try:
    mb = int(raw)
  except ValueError:
    raise ValueError(f"KOSMOS_HEAP_MB={raw!r} must be an integer number of MiB") from None
  if mb < MIN_HEAP_MB:
    raise ValueError(f"KOSMOS_HEAP_MB={mb} must be at least {MIN_HEAP_MB} "
                     "(16 MiB of control blocks, then data)")
  return mb
