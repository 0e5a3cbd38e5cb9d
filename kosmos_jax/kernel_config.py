"""Kernel knobs, as frozen dataclasses validated on construction (errors name the
values), and the closed-form rules that pick a knob left as None.

One config type per fused op family, passed as `config=` to the op (and through
`tp.*` and the `nn` modules as `ag_config=` / `rs_config=`):
  AgConfig  ops.ag_tn, ops.ag_nn, ops.bulk_ag_nn (the all-gather family) and
            ops.bulk_rs_nt (whose movers are the CTAs that start pushing)
  RsConfig  ops.tn_rs
  MoeLaunch ops.moe_forward, as `launch=` (its `config=` is the layer's MoEConfig;
            also `launch=` of moe.moe_layer and nn.MoE)
Exported as kosmos_jax.AgConfig / RsConfig / MoeLaunch. The reference path checks
a config's type and ignores its fields, as it ignores cu_cap. The rules are
evaluated once per shape on the host, at trace time: no per-call tuning.

Initial crews (CTAs that start moving / reducing before they switch to building):
the link saturates with about 8-16 copying CTAs (benchmarks/RESULTS.md, transport),
and more help only while there is little GEMM work per byte moved. Measured on
2xH200, TP 2, bf16, Hopper builders (2026-11-30, commit 92c01a8, after the wgmma
serialisation fix; `python scripts/gpu_bench_fused.py ag_tn|tn_rs [--crews ...]`,
ms per call, a row's crews from up to two runs; M total rows, K and N per rank as
the script takes them):

  ag_tn M=8192  K=4096  N=768    crews 16 / 24 / 32 / 48: 0.271 / 0.245 / 0.225 / 0.274 -> 32
  ag_tn M=16384 K=8192  N=1280   crews 16 / 24 / 32 / 48: 1.027 / 0.794 / 0.791 / 0.810 -> 32
  ag_tn M=8192  K=8192  N=2048   crews 24 / 32 / 48 / 64: 0.597 / 0.593 / 0.598 / 0.583 -> any
  ag_tn M=8192  K=4096  N=3072   crews 8 / 16 / 32:       0.529 / 0.423 / 0.440         -> 16
  ag_tn M=32768 K=4096  N=3584   crews 8 / 16 / 32:       1.809 / 1.794 / 2.060         -> 16
  ag_tn M=8192  K=8192  N=7168   crews 8 / 16 / 32:       1.656 / 1.636 / 1.718         -> 16
  ag_tn M=16384 K=16384 N=13312  crews 8 / 16 / 32:      11.794 / 11.567 / 11.840       -> 16
  tn_rs M=8192  K=3584  N=8192   crews 0 / 8 / 16 / 32:   0.998 / 0.993 / 0.972 / 1.053 -> 16
  tn_rs M=8192  K=512   N=4096   crews 0 / 8 / 16 / 32:   0.231 / 0.229 / 0.216 / 0.189 -> 32 (K small)

GEMM work per byte moved is N (per rank) for AG+GEMM and K (per rank) for
GEMM+RS, hence the rules below. A crew is clamped to the grid by the kernel.
"""
from __future__ import annotations

import dataclasses
import os

DEFAULT_HEAP_MB = 1024
MIN_HEAP_MB = 17  # kernels/tp/ag_layout.h: data starts at 16 MiB


@dataclasses.dataclass(frozen=True)
class AgConfig:
  """Fused AG+GEMM launch knobs: `config=` of ops.ag_tn, ops.ag_nn, ops.bulk_ag_nn
  and ops.bulk_rs_nt (`ag_config=` of the tp linears and nn modules).

  cu_cap: at most this many CTAs (= SMs), None for all SMs (paper §3.1.2).
  movers: CTAs that start as movers; None = ag_movers(n). Builders never move,
    so with peers at least one CTA starts as a mover (0 runs as 1).
  switching: True (default): a mover whose queue is empty builds (paper §3.1).
    False: a fixed split, to measure what switching buys; movers stop when their
    queue is empty and at least one CTA stays a builder.
  transport: how peer rows travel. "pull" (default): each rank publishes its rows
    into its own heap and the peers' movers copy them across. "push": movers copy
    their own rows straight into every peer's heap (one NVLink copy per row, no
    wait on a publish; in the transport benchmark push ran 352 GB/s with 8 CTAs,
    pull 198 with 8 and 357 with 16, benchmarks/RESULTS.md), and the own shard's
    tiles read x itself, so nothing is published and no builder waits for its
    own rows. Hopper builders only (bf16, sm_90); other inputs raise at run time.
    Correct in the one-GPU loopback tests (2026-12-01, the own-shard-from-x
    version included) and faster there (benchmarks/RESULTS.md, session 16), but
    not yet run or timed across GPUs, hence not the default. Only ag_tn has a
    push: ag_nn, bulk_ag_nn (their movers write the gathered output as they pull)
    and bulk_rs_nt (whose reduce-scatter always pushes) raise on "push"; the tp
    linears therefore hand their backward ops the config with transport="pull".

  For bulk_rs_nt, movers are the CTAs that start pushing dx_partial's bands (None:
  ag_movers of the output width n, since GEMM work per byte moved is n there too;
  0: every CTA builds first), and switching=False is a fixed split where movers
  push and reduce and builders only build.
  """
  cu_cap: int | None = None
  movers: int | None = None
  switching: bool = True
  transport: str = "pull"

  def __post_init__(self):
    if self.cu_cap is not None and (not isinstance(self.cu_cap, int) or isinstance(self.cu_cap, bool)
                                    or self.cu_cap < 1):
      raise ValueError(f"AgConfig: cu_cap={self.cu_cap!r} must be a positive int or None")
    if self.movers is not None and (not isinstance(self.movers, int) or isinstance(self.movers, bool)
                                    or self.movers < 0):
      raise ValueError(f"AgConfig: movers={self.movers!r} must be a non-negative int or None")
    if not isinstance(self.switching, bool):
      raise ValueError(f"AgConfig: switching={self.switching!r} must be a bool")
    if self.transport not in TRANSPORTS:
      raise ValueError(f"AgConfig: transport={self.transport!r} must be one of {TRANSPORTS}")


# The fused ops pass these names as their `transport` string attribute, and the
# loopback hook takes them too; csrc/fused_run.h parses them (no integer codes).
TRANSPORTS = ("pull", "push")
# GEMM+RS also folds: push, and each owner sums its chunk in its builders' epilogues.
RS_TRANSPORTS = TRANSPORTS + ("push_fold",)

# GEMM work per byte moved (N per rank for AG, K per rank for RS) at or below
# which the larger crew wins (table above).
AG_THIN_N = 2048
RS_THIN_K = 1024
CREW_DEFAULT, CREW_THIN = 16, 32
STAGES = ("fp32", "bf16")


def ag_movers(n: int) -> int:
  """Initial movers of AG+GEMM for n output columns per rank."""
  return CREW_THIN if n <= AG_THIN_N else CREW_DEFAULT


def rs_reducers(k: int, cu_cap: int | None = None, sm_count: int | None = None) -> int:
  """Initial reducers of GEMM+RS for a contraction of k per rank, on a grid of
  min(cu_cap, sm_count) CTAs. Under a CU cap both roles shrink in proportion
  (paper §3.1.2): the rule's crew is for a whole GPU, and a capped grid that kept
  it would starve its builders. Loopback (two ranks of 66 CTAs on one H200,
  benchmarks/RESULTS.md 2026-12-01): 70B-OProj-MBS1 took 0.884 ms with 32
  reducers, 0.669 with 16 and 0.636 with 2."""
  crew = CREW_THIN if k <= RS_THIN_K else CREW_DEFAULT
  if cu_cap is None or not sm_count or cu_cap >= sm_count:
    return crew
  return max(1, round(crew * cu_cap / sm_count))


MAX_BAND_ROWS = 64


# Weight bytes per rank above which GEMM+RS builds tall bands: H200's L2 is 50 MB
# (60 MB physical, split in two partitions), and one-row bands keep only about
# 132 / (n / 256) tile rows in flight, so a W that does not stay in L2 is streamed
# from DRAM once per one or two tile rows.
RS_TALL_W_BYTES = 32 << 20
RS_TALL_BAND_ROWS = 8


def rs_band_rows(n: int, k: int, itemsize: int = 2) -> int:
  """Tile rows per GEMM+RS band (Hopper builders) for W of k x n per rank.

  Measured on 2xH200, TP 2, bf16, the paper's 24 shapes (2026-11-30, 343e16f,
  benchmarks/RESULTS.md): band_rows=8 against 1 took the 405B shapes (W 67-218 MB)
  from 0.68-0.91x XLA to 0.94-1.04x and 70B-Down (W 59 MB) from 0.93-0.96x to
  0.99-1.01x, but cost 0-9% where W fits in L2 (70B-OProj 17 MB, 8B 4-15 MB):
  taller bands start the reduction later.
  """
  return RS_TALL_BAND_ROWS if n * k * itemsize > RS_TALL_W_BYTES else 1


@dataclasses.dataclass(frozen=True)
class RsConfig:
  """Fused GEMM+RS launch knobs: `config=` of ops.tn_rs (`rs_config=` of the tp
  linears and nn modules).

  cu_cap: at most this many CTAs (= SMs), None for all SMs.
  reducers: CTAs that start as reducers; None = rs_reducers(k, cu_cap, SMs); 0 = builders only
    until the GEMM queue is empty.
  stage: dtype of the partial tiles the peers pull: "bf16" (half the bytes; each
    partial rounded once, as XLA's bf16 dot is before its psum_scatter), "fp32"
    (exact partials), or None (default): "bf16" for bf16 inputs, else "fp32"
    (a bf16 stage of fp32 inputs would round what the caller kept exact, so it
    raises). The sum is fp32 in rank order either way. Portable builders
    (non-Hopper GPUs, other dtypes) always stage fp32.
  switching: True (default): a builder whose GEMM queue is empty reduces. False:
    a fixed split (builders stop; needs reducers >= 1 and a grid of >= 2 CTAs).
  band_rows: tile rows per band for the Hopper builders (1..MAX_BAND_ROWS; None =
    rs_band_rows(n, k)). A band is the unit reducers wait for; taller bands, built
    column by column, keep fewer W columns in flight for wide outputs but start
    the reduction later. Portable builders always use 1.
  transport: "pull" (default): partials are staged in the builder's heap and the
    owner's reducers pull them over NVLink. "push": the builders' epilogue
    writes each partial into its owner's heap (asynchronous copies beside the
    next tile's mainloop) and reducers read only local memory; same sum, same
    bits. "push_fold": push, but nobody reduces. Each rank builds its peers'
    chunks and, a few bands behind, its own, and the epilogue of each own tile adds
    the peers' pushed partials (ranks in order, fp32, rounded once: the same
    bits again) and stores Y; its own partials are never staged. Needs
    stage "bf16" (or None with bf16 inputs) and switching=True, and has no
    reducers (reducers None or 0).
    Hopper builders only; other inputs raise at run time. Neither push is yet
    measured across GPUs (2026-12-01), hence not the default.
  """
  cu_cap: int | None = None
  reducers: int | None = None
  stage: str | None = None
  switching: bool = True
  band_rows: int | None = None
  transport: str = "pull"

  def __post_init__(self):
    for name, v, lo in (("cu_cap", self.cu_cap, 1), ("reducers", self.reducers, 0)):
      if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
        raise ValueError(f"RsConfig: {name}={v!r} must be an int >= {lo} or None")
    if self.stage is not None and self.stage not in STAGES:
      raise ValueError(f"RsConfig: stage={self.stage!r} must be one of {STAGES} or None")
    if not isinstance(self.switching, bool):
      raise ValueError(f"RsConfig: switching={self.switching!r} must be a bool")
    b = self.band_rows
    if b is not None and (not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= MAX_BAND_ROWS):
      raise ValueError(f"RsConfig: band_rows={b!r} must be an int in [1, {MAX_BAND_ROWS}] or None")
    if self.transport not in RS_TRANSPORTS:
      raise ValueError(f"RsConfig: transport={self.transport!r} must be one of {RS_TRANSPORTS}")
    if self.transport == "push_fold" and (self.stage == "fp32" or not self.switching or self.reducers):
      raise ValueError(f"RsConfig: transport='push_fold' needs stage='bf16' (or None), switching=True "
                       f"and no reducers; "
                       f"got stage={self.stage!r}, switching={self.switching!r}, reducers={self.reducers!r}")
    if not self.switching and self.reducers == 0:
      raise ValueError("RsConfig: switching=False with reducers=0 leaves nobody to reduce; "
                       "give reducers >= 1 (or None for the default)")


@dataclasses.dataclass(frozen=True)
class MoeLaunch:
  """Fused MoE forward launch knobs: `launch=` of ops.moe_forward (and of
  moe.moe_layer and nn.MoE). The grid's cap is the ops' own `cu_cap=`.

  movers: CTAs that start as movers (they gather token rows into the expert-major
    arena, then switch); None = the kernel's own rule for the shape. Only movers
    dispatch, so at least 1.
  switching: True (default): movers whose queue is empty switch to building GEMM
    tiles and pushing ready units (paper §3.3.1). False: a fixed mover crew, to
    measure what switching buys (a benchmark arm); same results, bit for bit.
  """
  movers: int | None = None
  switching: bool = True

  def __post_init__(self):
    m = self.movers
    if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 1):
      raise ValueError(f"MoeLaunch: movers={m!r} must be an int >= 1 or None (only movers dispatch, "
                       "so the crew is never empty)")
    if not isinstance(self.switching, bool):
      raise ValueError(f"MoeLaunch: switching={self.switching!r} must be a bool")


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
