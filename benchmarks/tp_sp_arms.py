"""The problems and the arms of benchmarks/tp_sp.py (TP+SP collective GEMMs).

Shape map (DESIGN.md §7; benchmarks/data/paper_tp_shapes.json): the paper gives each
GEMM at TP 8 as (M, N, K) with M the total token rows and N, K what one rank holds.
Only one of N, K is actually split by tensor parallelism:
  ag_tn  (column-parallel fprop, Y = AG(X) @ W): N = out features / 8 is split; K = hidden
         is whole on every rank.  At TP = t: N_t = 8 N / t, K and M unchanged.
  tn_rs  (row-parallel fprop, Y = RS(X @ W)):    K = in features / 8 is split; N = hidden
         is whole on every rank.  At TP = t: K_t = 8 K / t, N and M unchanged.
(Check: 405B ffn 53248 -> FC1 N = 2*53248/8 = 13312, Down K = 53248/8 = 6656.) So each
rank's GEMM grows by 8/t while the gathered / scattered bytes per rank stay M x K
(resp. M x N): TP 2 is the paper's problem with 4x the GEMM per byte moved.

The backward kernels (paper Tables C.7-C.12; benchmarks/loopback.py reads the same
shapes the same way), per rank, with the gathered / scattered rows the collective's:
  ag_nn       row-parallel dgrad:   dy [M/t, K] gathered; dx [M, N] = AG(dy) @ w.T, w [N, K];
              the gathered dy [M, K] returned too (the weight gradient's operand)
  bulk_ag_nn  column-parallel dgrad: (AG(x) [M, N] from x [M/t, N], dy [M, K] @ w.T, w [N, K])
  bulk_rs_nt  column-parallel wgrad: (RS(dx_partial) [K/t, N] from [K, N], x_gathered.T @ dy
              [N, M] from x_gathered [K, N], dy [K, M]): K is the token rows here
They run with the paper's shapes as given only (--shape-map paper).

Two shape maps (--shape-map): `paper` (default; issue 6's convention and the one its
XLA baseline was measured with) runs M total rows and N, K per rank exactly as the
paper's tables give them, at any TP; `scaled` applies the 8/t model scaling above.

Every arm is a jitted function of global, sharded (x, w) run through jax.shard_map;
an arm that cannot run here raises Unavailable(reason) and is recorded, never
replaced by another implementation.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from kosmos_jax import AgConfig, RsConfig, ops

PAPER_TP = 8
AXIS = "tp"
BACKWARD = ("ag_nn", "bulk_ag_nn", "bulk_rs_nt")
SPLIT_DIM = {"ag_tn": "N", "tn_rs": "K"}  # the per-rank dim that TP divides (--shape-map scaled)
KNOB = {"ag_tn": "movers", "tn_rs": "reducers", **dict.fromkeys(BACKWARD, "movers")}  # initial crew knob
CONFIG = {"ag_tn": AgConfig, "tn_rs": RsConfig, **dict.fromkeys(BACKWARD, AgConfig)}  # public launch config
# The collective's rows: M (tokens) for all but bulk_rs_nt, whose tokens are K.
ROWS_DIM = {"bulk_rs_nt": "K"}
FIXED_CREW = 56  # the brief's fixed split: 56 of 132 CTAs start in the comm role
SWEEP = (8, 16, 33, 56, 88)  # small sweep for the best fixed split (grid-clamped)
# Smoke shapes: tiny, divisible by 2 and 4 ranks, so CPU virtual devices run them in ms.
SMOKE = {"ag_tn": [dict(name="smoke-a", M=64, N=32, K=48), dict(name="smoke-b", M=128, N=16, K=32)],
         "tn_rs": [dict(name="smoke-a", M=64, N=48, K=32), dict(name="smoke-b", M=128, N=32, K=16)],
         **dict.fromkeys(BACKWARD, [dict(name="smoke-a", M=64, N=32, K=48), dict(name="smoke-b", M=32, N=16, K=128)])}


class Unavailable(Exception):
  """The arm cannot run in this environment; the message is the recorded reason."""


@dataclasses.dataclass(frozen=True)
class Problem:
  kernel: str
  name: str
  tp: int
  M: int  # total rows
  N: int  # per rank, as run
  K: int  # per rank, as run
  dtype: object
  mesh: jax.sharding.Mesh

  @property
  def flop(self) -> float:
    return 2.0 * self.M * self.N * self.K  # one rank's GEMM; every rank does the same

  @property
  def operands(self):
    """[(global shape, spec)] of the op's operands (module docstring: per rank)."""
    M, N, K, t = self.M, self.N, self.K, self.tp
    row, col = P(AXIS, None), P(None, AXIS)
    return {"ag_tn": [((M, K), row), ((K, t * N), col)],  # x rows split (SP), w columns (TP)
            "tn_rs": [((M, t * K), col), ((t * K, N), row)],  # x columns and w rows split
            "ag_nn": [((M, K), row), ((t * N, K), row)],  # dy rows split (SP), w [N, K] a rank
            "bulk_ag_nn": [((M, N), row), ((M, t * K), col), ((N, t * K), col)],  # x, dy, w
            "bulk_rs_nt": [((t * K, N), row), ((t * K, N), row), ((K, t * M), col)],  # dxp, xg, dy
            }[self.kernel]

  @property
  def out_spec(self):
    """Outputs the same on every rank (a gathered operand) are concatenated like the rest."""
    row, col = P(AXIS, None), P(None, AXIS)
    return {"ag_tn": col, "tn_rs": row, "ag_nn": (col, row), "bulk_ag_nn": (row, row),
            "bulk_rs_nt": (row, col)}[self.kernel]

  def bytes_per_set(self, kind="std") -> int:  # one rank's inputs
    shapes = [s for s, _ in self.operands]
    per_rank = [(s[0] // self.tp if sp == P(AXIS, None) else s[0]) * (s[1] // self.tp if sp == P(None, AXIS) else s[1])
                for s, (_, sp) in zip(shapes, self.operands)]
    if kind == "full_rows":  # the first operand's rows are whole on every rank
      per_rank[0] = shapes[0][0] * shapes[0][1]
    return jnp.dtype(self.dtype).itemsize * sum(per_rank)


def problem(kernel, shape, tp, mesh, dtype, *, smoke=False, scaled=False) -> Problem:
  """The paper's TP-8 shape at TP = tp, as given or `scaled` (module docstring); smoke
  shapes are taken as given."""
  M, N, K = shape["M"], shape["N"], shape["K"]
  if scaled and not smoke and kernel in BACKWARD:
    raise ValueError(f"{kernel}: --shape-map scaled is defined for ag_tn and tn_rs only; the backward kernels "
                     "run the paper's shapes as given (--shape-map paper)")
  if scaled and not smoke:
    dim = SPLIT_DIM[kernel]
    full = (N if dim == "N" else K) * PAPER_TP
    if full % tp:
      raise ValueError(f"{kernel} {shape['name']}: {dim}*{PAPER_TP}={full} does not divide by tp={tp}")
    N, K = (full // tp, K) if dim == "N" else (N, full // tp)
  dim = ROWS_DIM.get(kernel, "M")
  if dict(M=M, K=K)[dim] % tp:
    raise ValueError(f"{kernel} {shape['name']}: {dim}={dict(M=M, K=K)[dim]} (the collective's rows) does not "
                     f"divide by tp={tp}")
  return Problem(kernel, shape["name"], tp, M, N, K, dtype, mesh)


def make_inputs(pb: Problem, i: int, kind: str = "std") -> tuple:
  """Fresh operand set i, generated already sharded (no full copy on one device)."""
  ops_ = list(pb.operands)
  if kind == "full_rows":  # every rank gets all M rows of the first operand, its own
    (m, k), _ = ops_[0]
    ops_[0] = ((pb.tp * m, k), P(AXIS, None))
  return tuple(_normal(shape, jnp.dtype(pb.dtype), NamedSharding(pb.mesh, spec))(jax.random.key(7919 * i + j))
               for j, (shape, spec) in enumerate(ops_))


@functools.lru_cache(maxsize=64)
def _normal(shape, dtype, sharding):
  # One compiled generator per (shape, dtype, sharding): the rotation makes up to 16 sets.
  return jax.jit(lambda k: jax.random.normal(k, shape, jnp.float32).astype(dtype), out_shardings=sharding)


def _smap(pb, body, *, full_rows=False, out_spec=None, check_vma=True):
  """`body` over the op's operands; full_rows: the first is make_inputs' "full_rows"."""
  specs = [sp for _, sp in pb.operands]
  if full_rows:
    specs[0] = P(AXIS, None)
  return jax.jit(jax.shard_map(body, mesh=pb.mesh, in_specs=tuple(specs), out_specs=out_spec or pb.out_spec,
                               check_vma=check_vma))


def _gather(x):
  return jax.lax.all_gather(x, AXIS, axis=0, tiled=True)


def _scatter(y):
  return jax.lax.psum_scatter(y, AXIS, scatter_dimension=0, tiled=True)


def _need_fused(op):
  ok, why = ops.fused_status(op)
  if not ok:
    raise Unavailable(f"fused {op} unavailable: {why}")


def _kosmos_gemm(a, b, layout="TN"):
  return ops.matmul(a, b, layout=layout, impl="fused")


def _xla_gemm(a, b, layout="TN"):
  return {"TN": lambda: a @ b, "NN": lambda: a @ b.T, "NT": lambda: a.T @ b}[layout]()


# Each op as XLA's collective(s) around a GEMM `gemm(a, b, layout)`: the xla arm with
# XLA's dot, kosmos_unfused with ours. Layouts as ops.matmul's (NN: a @ b.T; NT: a.T @ b).
def _unfused(kernel, gemm):
  return {"ag_tn": lambda x, w: gemm(_gather(x), w),
          "tn_rs": lambda x, w: _scatter(gemm(x, w)),  # bf16 partials summed by NCCL
          "ag_nn": lambda dy, w: (lambda g: (gemm(g, w, "NN"), g))(_gather(dy)),
          "bulk_ag_nn": lambda x, dy, w: (_gather(x), gemm(dy, w, "NN")),
          "bulk_rs_nt": lambda dxp, xg, dy: (_scatter(dxp), gemm(xg, dy, "NT")),
          }[kernel]


# ---- arm builders: Problem -> {variant: (jitted fn(*operands), input kind)} ------------
# Input kind "std" is the op's own sharded operands; "full_rows" gives every rank all M
# rows of the first (global [tp*M, K], rows split), so a GEMM-alone arm needs no gather.

def arm_xla(pb):
  """XLA's own collective and dot (NCCL + cuBLAS on GPU): the baseline."""
  return {"": (_smap(pb, _unfused(pb.kernel, _xla_gemm)), "std")}


def arm_comm_alone(pb):
  """XLA's collective alone: the bytes-over-link half of the floor."""
  row = P(AXIS, None)
  if pb.kernel in ("ag_tn", "ag_nn"):  # each rank's gathered [M, K], concatenated over ranks
    return {"": (_smap(pb, lambda x, w: _gather(x), out_spec=row, check_vma=False), "std")}
  if pb.kernel == "bulk_ag_nn":
    return {"": (_smap(pb, lambda x, dy, w: _gather(x), out_spec=row, check_vma=False), "std")}
  if pb.kernel == "bulk_rs_nt":
    return {"": (_smap(pb, lambda dxp, xg, dy: _scatter(dxp), out_spec=row), "std")}

  def rs_only(x, w):  # an [M, N] partial like the GEMM's (costs one elementwise write of it)
    return _scatter(jnp.broadcast_to(x[:, :1], (x.shape[0], w.shape[1])) + w[:1, :])
  return {"": (_smap(pb, rs_only), "std")}


GEMM_OF = {  # the op's GEMM alone on operands already in place: (operand indices, layout)
    "ag_tn": ((0, 1), "TN"), "tn_rs": ((0, 1), "TN"), "ag_nn": ((0, 1), "NN"), "bulk_ag_nn": ((1, 2), "NN"),
    "bulk_rs_nt": ((1, 2), "NT")}


def arm_gemm_alone(pb, which):
  """One rank's whole GEMM with no communication (the compute floor)."""
  if which == "kosmos":
    _need_fused("matmul")
  dot = _kosmos_gemm if which == "kosmos" else _xla_gemm
  (i, j), layout = GEMM_OF[pb.kernel]
  full = pb.kernel in ("ag_tn", "ag_nn")  # their A rows are the gathered ones: all of them on every rank
  out = P(AXIS, None) if layout != "NT" else P(None, AXIS)
  return {"": (_smap(pb, lambda *a: dot(a[i], a[j], layout), full_rows=full, out_spec=out),
               "full_rows" if full else "std")}


def arm_kosmos_unfused(pb):
  """XLA's collective, then our Hopper GEMM."""
  _need_fused("matmul")
  return {"": (_smap(pb, _unfused(pb.kernel, _kosmos_gemm)), "std")}


def fused_config(kernel, knobs):
  """`kernel`'s public launch config (AgConfig / RsConfig) with `knobs` ({name:
  value}); Unavailable names a knob the config type does not have."""
  cls = CONFIG[kernel]
  unknown = sorted(set(knobs) - {f.name for f in dataclasses.fields(cls)})
  if unknown:
    raise Unavailable(f"not supported: {cls.__name__} ({kernel}) has no knob {', '.join(unknown)}")
  return cls(**knobs)


def _fused_call(kernel, config, *operands):
  kw = dict(return_gathered=True) if kernel == "ag_nn" else {}  # as the row-parallel rule calls it
  return getattr(ops, kernel)(*operands, axis_name=AXIS, impl="fused", config=config, **kw)


def arm_kosmos_fused(pb, knobs=None):
  """The public op with impl="fused"; with `knobs` ({name: value}, e.g. band_rows=8),
  given as its config, recorded as the variant."""
  _need_fused(pb.kernel)
  cfg = fused_config(pb.kernel, knobs or {})
  variant = ",".join(f"{k}={v}" for k, v in sorted((knobs or {}).items()))
  return {variant: (_smap(pb, functools.partial(_fused_call, pb.kernel, cfg)), "std")}


def arm_fixed_split(pb, crews):
  """The fused op with role switching off (switching=False): `crew` CTAs move (AG) or
  reduce (RS) and nothing else, the rest only build (paper Table 2). A crew of 0 has
  nobody to move / reduce, so crews start at 1; the kernel keeps one builder."""
  _need_fused(pb.kernel)
  return {f"{KNOB[pb.kernel]}={c}": (_smap(pb, functools.partial(
      _fused_call, pb.kernel, fused_config(pb.kernel, {"switching": False, KNOB[pb.kernel]: c}))), "std")
          for c in crews if c >= 1}


def num_sms() -> int:
  return int(getattr(jax.devices()[0], "core_count", 0) or 132)


def sweep_crews(grid: int) -> list[int]:
  return sorted({min(c, grid - 1) for c in (*SWEEP, FIXED_CREW)})


# ---- JAX's Pallas Mosaic-GPU all-gather matmul (AG only) --------------------------
# Tile configs to try; the best median wins. Its API has changed across JAX releases
# (a TuningConfig in 0.10, separate block_* arguments before), so the call is built
# from the signature found at run time and anything else is recorded as a failure.
PALLAS_CONFIGS = (
    dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4),
    dict(tile_m=128, tile_n=256, tile_k=64, max_concurrent_steps=4),
    dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4, wg_dimension="M"),
    dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=5, grid_minor_dim="M", grid_tile_width=8),
)


def _pallas_module():
  if jax.devices()[0].platform != "gpu":
    raise Unavailable(f"Mosaic GPU kernels need a CUDA GPU (platform is {jax.devices()[0].platform})")
  try:
    from jax.experimental.pallas.ops.gpu import collective_matmul_mgpu as mod
  except Exception as e:  # absent or broken in this JAX: record why
    raise Unavailable(f"import collective_matmul_mgpu failed: {type(e).__name__}: {e}") from None
  if not hasattr(mod, "all_gather_lhs_matmul"):
    raise Unavailable("collective_matmul_mgpu has no all_gather_lhs_matmul")
  return mod


def _pallas_kwargs(mod, cfg: dict, dtype) -> dict:
  params = inspect.signature(mod.all_gather_lhs_matmul).parameters
  kw = {"dtype": dtype} if "dtype" in params else {}  # its default is float16
  if "config" in params:
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm
    tc = getattr(mod, "TuningConfig", None) or hm.TuningConfig
    names = {f.name for f in dataclasses.fields(tc)}
    vals = {k: (hm.MatmulDimension[v] if isinstance(v, str) else v) for k, v in cfg.items() if k in names}
    return dict(kw, config=tc(**vals))
  if "block_m" in params:  # older API: one CTA row band per SM group
    return dict(kw, block_m=cfg["tile_m"], block_n=cfg["tile_n"], block_k=cfg["tile_k"],
                max_concurrent_steps=cfg["max_concurrent_steps"], sm_n_tile=1)
  raise Unavailable(f"unknown all_gather_lhs_matmul signature {list(params)}")


def arm_pallas_mgpu(pb):
  """One variant per tile config; building fails per config, recorded by the caller."""
  if pb.kernel != "ag_tn":
    raise Unavailable("not applicable: collective_matmul_mgpu only has an all-gather matmul")
  mod = _pallas_module()
  arms = {}
  for cfg in PALLAS_CONFIGS:
    name = ",".join(f"{k}={v}" for k, v in cfg.items())
    try:
      body = functools.partial(mod.all_gather_lhs_matmul, axis_name=AXIS, **_pallas_kwargs(mod, cfg, pb.dtype))
    except Unavailable:  # the API itself does not fit: the whole arm is unavailable
      raise
    except Exception as e:  # this config is rejected: the caller records it, the others still run
      arms[name] = e
      continue
    arms[name] = (_smap(pb, body, check_vma=False), "std")
  return arms
