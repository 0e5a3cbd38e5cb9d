"""The MoE layer's forward at EP = 1 on one GPU (or, with --ep N, over the first N GPUs of
one host), as the paper's Figure 8 plots it: TFLOP/s per GPU per preset and arm, at 8192
tokens per GPU, bf16, balanced and skewed routing (DESIGN.md §7).

Presets: kosmos_jax.moe.PRESETS (Qwen3-30B-A3B, Qwen3-235B-A22B, DeepSeek-V3, Llama 4
Scout and Maverick). A preset whose routed experts' weights exceed --weight-budget of the
device's memory keeps its per-expert shapes and loses experts (the table says "E of
E_preset"); all five fit an H200 (Maverick's 128 experts are 32 GB).

Routing, built into the tokens and the router so that every load is known exactly (the
router still computes it: top-k of real logits, through route / the kernel's inputs):
router_w is c * I on its first E rows (c = 4) and zero elsewhere, so token i's logits are
4 * x[i, :E]; x[i, :E] is a +-1 code, +1 on the experts token i should pick, plus noise
of 0.01 (so no two scores tie), and the other features of x are N(0, 1).
  balanced  token i picks experts (i * k + j) mod E, j < k: every expert gets exactly
            t * k / E pairs (t * k is a multiple of E for every preset at 8192 tokens;
            otherwise loads differ by one). k consecutive ids lie in one of DeepSeek-V3's
            groups (k divides the group's 32 experts), so group-limited routing picks them.
  skewed    even tokens pick experts 0 .. k-1 (a hot set), the odd ones spread over all
            experts as balanced does (odd token i as token i // 2): those k experts get
            t / 2 pairs more, far past the twin's capacity at 8192 tokens, so its dropless
            fallback runs. A top-1 preset puts half the tokens on expert 0.
The max_load column (largest count / mean count) is measured on the router's picks.

Arms, forward only, each under jax.jit with its own warm-up and sustained timing loop
(harness.time_fn: --settle-s of back-to-back calls, then the median of --reps windows of
--calls pipelined calls; tokens rotated past the L2):
  reference    ops.moe_forward(impl="reference"): the twin in XLA (router, capped dispatch
               or the dropless pass, batched expert GEMMs, combine, fold, shared expert)
  fused        ops.moe_forward(impl="fused"): the router in XLA, then one
               kosmos_moe_forward launch (the shared expert's tiles in it)
               Both with for_backward=False, the forward moe_layer runs outside a gradient
               (the fused launch keeps no pre-activations; XLA drops the twin's residuals
               anyway). The train_* arms' forwards keep them.
  fused_fixed  the same with MoeLaunch(switching=False): a fixed mover crew
  floor        the expert GEMMs alone (kosmos_grouped_gemm, kosmos_jax.testing.grouped_gemm)
               on pre-permuted balanced rows: GEMM1 (N = 2I, no SwiGLU) and GEMM2 (K = I,
               N = h) on t * k rows, each expert's t * k / E padded to 128, plus the shared
               expert's two GEMMs over the t rows (one-expert grouped GEMMs) where the
               preset has one. The same for both routings.
  floor_bwd    the backward's expert GEMMs alone on the same rows (kosmos_grouped_swiglu_bwd:
               dgrad2 with the SwiGLU backward, dh1 = f(dY @ W2[e]^T, h1); kosmos_grouped_wgrad:
               wgrad2 act^T dY and wgrad1 X^T dh1; kosmos_grouped_dgrad: dgrad1 dh1 @ W1[e]^T),
               plus the shared expert's four as one-expert launches: the backward's floor.
               Not part of the default run (name it in --arms).
  train_reference, train_fused
               jax.grad of kosmos_jax.moe.moe_layer (forward + backward, gradients of x and
               every weight) with impl="reference" / "fused" (both directions fused: the
               backward's megakernel, with the router's and the shared expert's gradients
               in XLA). Not part of the default run.
An arm that cannot run here is recorded with its reason (status unavailable / failed),
never replaced by another implementation.

--ep N (issue 29): the layer arms over an EP group of N GPUs (each holding E / N experts
and 8192 tokens; the reference layer's capacity-padded all_to_all and the fused launch's
pushes through the symmetric heap, KOSMOS_HEAP_MB); TFLOP/s per GPU (each GPU's share of
the FLOPs over the wall time); the floor is one GPU's share alone: its t * k rows over
its E / N experts (floor_bwd: EP = 1 only). At EP > 1 train_fused runs both fused
launches over the group.

TFLOP/s count the routed FLOPs, 2 t k h 2I + 2 t k I h = 6 t k h I, plus the shared
expert's 6 t h I_s where the preset has one (DeepSeek-V3, Llama 4): every arm computes
it (the floor with its two extra GEMMs), so every arm of a preset counts the same FLOPs.
The router (2 t h E) and the SwiGLU are not counted. frac_of_floor = floor / arm time.
floor_bwd counts the backward's: twice the forward's; the train arms three times (the
gflop column says so).

  python benchmarks/moe.py                                   # one H200: everything
  python benchmarks/moe.py --presets deepseek-v3 --routing skewed --arms fused,floor
  python benchmarks/moe.py --dry-run                         # CPU, toy sizes, reference arm
Writes <out-dir>/moe<tag>.csv, moe<tag>.png and moe<tag>.md (out-dir: benchmarks/results,
or benchmarks/out with --dry-run), copies them into $OUT when OUT is set, prints the
Markdown table and appends it to benchmarks/RESULTS.md (not with --dry-run / --no-append).
--dry-run shrinks every preset (hidden 64, I 128, at most 16 experts, 256 tokens) and
times two windows of two calls: it checks the plumbing, not the numbers.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import harness  # noqa: E402

from kosmos_jax import MoeLaunch, moe, ops  # noqa: E402
from kosmos_jax.testing import grouped_gemm as gg  # noqa: E402
from kosmos_jax.testing import moe_forward_built, moe_forward_xla_part  # noqa: E402

BF16 = jnp.bfloat16
ARMS = ("reference", "fused", "fused_fixed", "floor", "xla_part", "floor_bwd", "train_reference", "train_fused")
# Arms that are not the forward, and their FLOPs in forwards: the backward's are twice the
# forward's, a training step's (forward + backward) three times.
FLOP_FACTOR = {"floor_bwd": 2, "train_reference": 3, "train_fused": 3}
BACKWARD_ARMS = tuple(FLOP_FACTOR)
ROUTINGS = ("balanced", "skewed")
NAMES = ("router_w", "gate_up", "down", "shared_gate_up", "shared_down", "expert_bias")
LOGIT_SCALE = 4.0  # c: a chosen expert's logit is ~ +4, the others' ~ -4
CODE_NOISE = 0.01
PEAK_GUESS = 400e12  # FLOP/s, only to size the calls per timed window
TOY = dict(hidden=64, expert_intermediate=128, max_experts=16, tokens=256)
COLUMNS = ("preset", "routing", "ep", "arm", "status", "reason", "experts", "experts_preset", "top_k", "hidden",
           "expert_intermediate", "shared_intermediate", "tokens", "gflop", "median_ms", "min_ms", "calls",
           "reps", "tflops", "frac_of_floor", "speedup_vs_reference", "rel_err_vs_reference", "max_load",
           "twin_fallback")


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--presets", default=",".join(moe.PRESETS), help=f"comma-separated, of {list(moe.PRESETS)}")
  ap.add_argument("--routing", default="both", choices=("both",) + ROUTINGS)
  ap.add_argument("--arms", default=None, help=f"comma-separated, of {ARMS} (default: all; --dry-run: reference)")
  ap.add_argument("--tokens", type=int, default=None, help="tokens per GPU (default 8192; --dry-run 256)")
  ap.add_argument("--ep", type=int, default=1, help="EP group: the first EP devices (one host's GPUs)")
  ap.add_argument("--calls", type=int, default=0, help="calls per timed window (0: ~20 ms of work)")
  ap.add_argument("--reps", type=int, default=5, help="timed windows per arm (median)")
  ap.add_argument("--settle-s", type=float, default=1.5, help="back-to-back seconds per arm before its windows")
  ap.add_argument("--weight-budget", type=float, default=0.4,
                  help="largest share of device memory the routed experts' weights may take")
  ap.add_argument("--max-experts", type=int, default=None, help="reduce every preset to at most this many experts")
  ap.add_argument("--dry-run", action="store_true", help="CPU: toy sizes, reference arm, no RESULTS.md")
  ap.add_argument("--no-append", action="store_true", help="do not append the table to benchmarks/RESULTS.md")
  ap.add_argument("--timeline", default=None, metavar="PRESET",
                  help="instead of timing: one traced fused forward of PRESET (first --routing), its role "
                       "timeline as PNG + Chrome-trace JSON and the span of each phase (needs a KOSMOS_TRACE build)")
  ap.add_argument("--timeline-step", action="store_true",
                  help="with --timeline: trace one fused training step (forward and backward launches) instead")
  ap.add_argument("--out-dir", default=None)
  ap.add_argument("--tag", default="")
  args = ap.parse_args(argv)
  args.arms = args.arms or ("reference" if args.dry_run else ",".join(a for a in ARMS if a not in BACKWARD_ARMS))
  for name, given, allowed in (("--arms", args.arms, ARMS), ("--presets", args.presets, tuple(moe.PRESETS))):
    bad = [a for a in given.split(",") if a not in allowed]
    if bad:
      ap.error(f"{name}: {bad} not in {list(allowed)}")
  args.tokens = args.tokens or (TOY["tokens"] if args.dry_run else 8192)
  if not 1 <= args.ep <= len(jax.devices()):
    ap.error(f"--ep {args.ep}: {len(jax.devices())} devices here")
  if args.ep > 1 and args.timeline:
    ap.error("--timeline traces one GPU's launches: EP = 1 only")
  if args.dry_run:
    args.calls, args.reps, args.settle_s = args.calls or 2, min(args.reps, 2), 0.0
  here = harness.HERE
  args.out_dir = pathlib.Path(args.out_dir or (here / "out" if args.dry_run else here / "results"))
  return args


# ---- configs ---------------------------------------------------------------------

def _valid_experts(cfg: moe.MoEConfig, e: int) -> bool:
  if e < cfg.top_k or e % cfg.n_groups:
    return False
  per = e // cfg.n_groups
  return cfg.n_groups == 1 or (per >= 2 and cfg.top_k <= cfg.topk_groups * per)


def with_experts(cfg: moe.MoEConfig, e: int) -> moe.MoEConfig:
  """cfg with at most e experts, per-expert shapes kept; the groups go where too few
  experts are left for them."""
  e = max(min(e, cfg.num_experts), cfg.top_k)
  while e < cfg.num_experts and not _valid_experts(cfg, e):
    e -= 1
  if e == cfg.num_experts:
    return cfg
  if not _valid_experts(cfg, e):
    return cfg.replace(num_experts=e, n_groups=1, topk_groups=1)
  return cfg.replace(num_experts=e)


def _device_bytes() -> int | None:
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("bytes_limit")


def bench_config(name: str, args) -> moe.MoEConfig:
  """The preset as benchmarked: toy widths with --dry-run; experts cut to the budget."""
  cfg = moe.PRESETS[name]
  if args.dry_run:
    cfg = with_experts(cfg, TOY["max_experts"]).replace(
        hidden=TOY["hidden"], expert_intermediate=TOY["expert_intermediate"],
        shared_expert_intermediate=TOY["expert_intermediate"] if cfg.shared_expert_intermediate else 0)
  if args.max_experts:
    cfg = with_experts(cfg, args.max_experts)
  limit = _device_bytes()
  per_expert = 3 * cfg.hidden * cfg.expert_intermediate * 2
  if limit and cfg.num_experts * per_expert > args.weight_budget * limit:
    cfg = with_experts(cfg, int(args.weight_budget * limit // per_expert))
  ep = getattr(args, "ep", 1)  # callers with their own args (moe_train_step.py) run EP = 1
  if cfg.num_experts % ep:
    raise SystemExit(f"{name}: num_experts={cfg.num_experts} does not split over --ep {ep}")
  if cfg.hidden < cfg.num_experts:
    raise SystemExit(f"{name}: hidden={cfg.hidden} < num_experts={cfg.num_experts}: the routing code "
                     "needs one feature per expert")
  return cfg


def flops(cfg: moe.MoEConfig, t: int) -> tuple[float, float]:
  """(routed, shared) FLOPs of one forward: 6 t k h I and 6 t h I_s."""
  h, i = cfg.hidden, cfg.expert_intermediate
  return 6.0 * t * cfg.top_k * h * i, 6.0 * t * h * cfg.shared_expert_intermediate


# ---- inputs ----------------------------------------------------------------------

def _normal(key, shape, scale):
  """bf16 normal, drawn one leading slice at a time (no fp32 copy of a 30 GB weight)."""
  draw = lambda k, s: (scale * jax.random.normal(k, s, jnp.float32)).astype(BF16)
  if len(shape) < 3:
    return draw(key, shape)
  return jax.lax.map(lambda k: draw(k, shape[1:]), jax.random.split(key, shape[0]))


def params(cfg: moe.MoEConfig) -> dict:
  e, h, i, si = cfg.num_experts, cfg.hidden, cfg.expert_intermediate, cfg.shared_expert_intermediate
  keys = iter(jax.random.split(jax.random.key(0), 4))
  p = {"router_w": jnp.zeros((h, e), BF16).at[jnp.arange(e), jnp.arange(e)].set(LOGIT_SCALE),
       "gate_up": jax.jit(_normal, static_argnums=(1, 2))(next(keys), (e, h, 2, i), h ** -0.5),
       "down": jax.jit(_normal, static_argnums=(1, 2))(next(keys), (e, i, h), i ** -0.5)}
  if si:
    p["shared_gate_up"] = _normal(next(keys), (h, 2, si), h ** -0.5)
    p["shared_down"] = _normal(next(keys), (si, h), si ** -0.5)
  if cfg.use_expert_bias:
    p["expert_bias"] = jnp.zeros((e,), jnp.float32)
  return p


def picks(cfg: moe.MoEConfig, t: int, routing: str) -> jax.Array:
  """[t, k] the experts each token is built to pick (see the module docstring)."""
  e, k = cfg.num_experts, cfg.top_k
  i, j = jnp.arange(t)[:, None], jnp.arange(k)[None, :]
  if routing == "balanced":
    return (i * k + j) % e
  # Odd tokens number themselves i // 2: the balanced pattern over all experts again
  # (with their own i, every odd token would pick the same k experts when 2k divides E).
  return jnp.where(i % 2 == 0, j, ((i // 2) * k + j) % e)


def tokens(cfg: moe.MoEConfig, t: int, routing: str, seed: int) -> jax.Array:
  e = cfg.num_experts
  k1, k2 = jax.random.split(jax.random.key(1000 + seed))
  code = jnp.full((t, e), -1.0, jnp.float32).at[jnp.arange(t)[:, None], picks(cfg, t, routing)].set(1.0)
  code = code + CODE_NOISE * jax.random.normal(k1, (t, e), jnp.float32)
  x = jax.random.normal(k2, (t, cfg.hidden), jnp.float32).at[:, :e].set(code)
  return x.astype(BF16)


def loads(cfg: moe.MoEConfig, x, p) -> tuple[float, bool]:
  """(largest count / mean count, whether the twin's capped buffers overflow) of the
  router's actual picks on x."""
  r = jax.jit(lambda x, w, b: moe.route(x, w, cfg, b))(x, p["router_w"], p.get("expert_bias"))
  counts = np.bincount(np.asarray(r.indices).ravel(), minlength=cfg.num_experts)
  return float(counts.max() / counts.mean()), bool(counts.max() > cfg.capacity(x.shape[0]))


# ---- arms --------------------------------------------------------------------------

class Unavailable(Exception):
  """The arm cannot run here; the message is the recorded reason."""


EP = 1  # --ep: the EP group's size (main sets it)


def _mesh():
  return jax.sharding.Mesh(np.array(jax.devices()[:EP]), ("ep",))


def layer_arm(cfg: moe.MoEConfig, names: tuple, impl: str, launch=None):
  """jit(shard_map) of ops.moe_forward over the EP mesh: (x, *params) -> (y, aux)."""
  if impl == "fused":
    ok, why = ops.fused_status("moe_forward")
    if not ok:
      raise Unavailable(f"fused moe_forward unavailable: {why}")
    if not moe_forward_built():
      raise Unavailable("kosmos_moe_forward is not compiled into this extension")

  def local(x, *ps):
    p = dict(zip(names, ps))
    y, aux, _ = ops.moe_forward(x, p["router_w"], p["gate_up"], p["down"], p.get("shared_gate_up"),
                                p.get("shared_down"), p.get("expert_bias"), config=cfg, axis_name="ep",
                                impl=impl, launch=launch, for_backward=False)
    return y, aux

  specs = {"gate_up": P("ep"), "down": P("ep")}
  return jax.jit(jax.shard_map(local, mesh=_mesh(), in_specs=(P("ep"), *[specs.get(n, P()) for n in names]),
                               out_specs=(P("ep"), P())))


def train_arm(cfg: moe.MoEConfig, names: tuple, impl: str):
  """jit(shard_map) of jax.grad of moe_layer (loss: <y, 1> + aux) over the EP mesh:
  (x, *params) -> the gradients of x and every parameter."""
  if impl == "fused":
    for op in ("moe_forward", "moe_backward"):
      ok, why = ops.fused_status(op)
      if not ok:
        raise Unavailable(f"fused {op} unavailable: {why}")

  def local(x, *ps):
    def loss(x, *ps):
      y, aux = moe.moe_layer(x, dict(zip(names, ps)), cfg, axis_name="ep", impl=impl)[:2]
      return jnp.sum(y.astype(jnp.float32)) + aux
    return jax.grad(loss, argnums=tuple(range(len(names) + 1)))(x, *ps)

  specs = {"gate_up": P("ep"), "down": P("ep")}
  in_specs = (P("ep"), *[specs.get(n, P()) for n in names])
  return jax.jit(jax.shard_map(local, mesh=_mesh(), in_specs=in_specs, out_specs=in_specs))


def xla_part_arm(cfg: moe.MoEConfig, names: tuple):
  """What the fused arm runs in XLA before its launch (routing, aux loss), timed alone:
  the fused arm's time minus this is the launch's (and the layout's)."""
  def local(x, *ps):
    p = dict(zip(names, ps))
    routing, aux = moe_forward_xla_part(x, p["router_w"], p.get("expert_bias"), config=cfg, axis_name="ep")
    return routing.indices, routing.weights, aux

  return jax.jit(jax.shard_map(local, mesh=_mesh(), in_specs=(P("ep"), *[P() for _ in names]),
                               out_specs=(P("ep"), P("ep"), P())))


def floor_inputs(cfg: moe.MoEConfig, t: int, p: dict, seed: int, ep: int = 1) -> tuple:
  """Pre-permuted balanced rows for the floor's GEMMs, random (each GEMM's own input,
  as the GEMMs alone need no SwiGLU between them): (a1 [M, h], a2 [M, I], gate_up, down,
  tile_expert[, shared a1 [t, h], shared a2 [t, I_s], shared gate_up, down, tiles]).
  The weights are the layer's own arrays (floor_arm reshapes them under jit, for free:
  an eager reshape would copy 20 GB of Maverick's). ep > 1: one GPU's share, its t * k
  rows over its E / ep experts (the first E / ep of the arrays)."""
  e, h, i, si = cfg.num_experts // ep, cfg.hidden, cfg.expert_intermediate, cfg.shared_expert_intermediate
  per, te = gg.balanced_tiles(-(-t * cfg.top_k // e), e)
  k1, k2, k3, k4 = jax.random.split(jax.random.key(2000 + seed), 4)
  gate_up, down = (p["gate_up"], p["down"]) if ep == 1 else (p["gate_up"][:e], p["down"][:e])
  out = (_normal(k1, (e * per, h), 1.0), _normal(k2, (e * per, i), 1.0), gate_up, down, jnp.asarray(te))
  if si:
    rows, te1 = gg.balanced_tiles(t, 1)  # t rows, padded to whole tiles
    out += (_normal(k3, (rows, h), 1.0), _normal(k4, (rows, si), 1.0), p["shared_gate_up"], p["shared_down"],
            jnp.asarray(te1))
  return out


def floor_arm():
  ok, why = gg.status()
  if not ok:
    raise Unavailable(f"floor: {why}")

  def f(a1, a2, gate_up, down, te, *shared):
    e, h = gate_up.shape[:2]
    out = (gg.grouped_gemm(a1, gate_up.reshape(e, h, -1), te), gg.grouped_gemm(a2, down, te))
    if shared:  # the one always-on expert as a one-expert grouped GEMM
      s1, s2, sgu, sd, te1 = shared
      out += (gg.grouped_gemm(s1, sgu.reshape(1, h, -1), te1), gg.grouped_gemm(s2, sd[None], te1))
    return out

  return jax.jit(f)


def floor_bwd_inputs(cfg: moe.MoEConfig, t: int, p: dict, seed: int) -> tuple:
  """The backward floor's rows, as floor_inputs': (dY [M, h], X [M, h], h1 [M, 2I],
  act [M, I], gate_up, down, tile_expert, expert_rb[, the shared expert's the same over
  its t rows])."""
  e, h, i, si = cfg.num_experts, cfg.hidden, cfg.expert_intermediate, cfg.shared_expert_intermediate
  per, te = gg.balanced_tiles(-(-t * cfg.top_k // e), e)
  keys = iter(jax.random.split(jax.random.key(3000 + seed), 8))

  def rows(m, width):
    return _normal(next(keys), (m, width), 1.0)

  def one(m, width_i, w1, w2, te):
    return (rows(m, h), rows(m, h), rows(m, 2 * width_i), rows(m, width_i), w1, w2, jnp.asarray(te),
            jnp.asarray(gg.expert_row_blocks(te, w1.shape[0])))

  out = one(e * per, i, p["gate_up"], p["down"], te)
  if si:
    m, te1 = gg.balanced_tiles(t, 1)
    out += one(m, si, p["shared_gate_up"][None], p["shared_down"][None], te1)
  return out


def floor_bwd_arm():
  ok, why = gg.status()
  if not ok:
    raise Unavailable(f"floor_bwd: {why}")

  def grads(dy, x, h1, act, gate_up, down, te, rb):
    e, h = gate_up.shape[:2]
    w1 = gate_up.reshape(e, h, -1)  # [E, h, 2I]: dgrad1's B [E, N = h, K = 2I]
    dh1 = gg.grouped_swiglu_bwd(dy, down, h1, te)
    return (dh1, gg.grouped_wgrad(act, dy, rb), gg.grouped_dgrad(dh1, w1, te), gg.grouped_wgrad(x, dh1, rb))

  def f(*ins):
    out = grads(*ins[:8])
    if len(ins) > 8:
      out += grads(*ins[8:])
    return out

  return jax.jit(f)


def _calls(args, gflop: float) -> int:
  return args.calls or max(2, min(20, round(20e-3 / (gflop * 1e9 / PEAK_GUESS))))


def time_arm(fn, sets, args, gflop):
  jax.block_until_ready(fn(*sets[0]))  # compile before the clock starts
  return harness.time_fn(fn, sets, warmup=2, calls=_calls(args, gflop), reps=args.reps, warmup_s=args.settle_s)


def bench(name: str, routing: str, args) -> list[dict]:
  cfg, t = bench_config(name, args), args.tokens
  preset = moe.PRESETS[name]
  routed, shared = flops(cfg, t)
  gflop = (routed + shared) * 1e-9
  p = params(cfg)
  names = tuple(n for n in NAMES if n in p)
  x_bytes = EP * t * cfg.hidden * 2  # the EP group's tokens, t per GPU
  sets = harness.rotation(lambda i: (tokens(cfg, EP * t, routing, i), *[p[n] for n in names]), x_bytes)
  max_load, fallback = loads(cfg, sets[0][0], p)
  base = dict(preset=name, routing=routing, ep=EP, experts=cfg.num_experts, experts_preset=preset.num_experts,
              top_k=cfg.top_k, hidden=cfg.hidden, expert_intermediate=cfg.expert_intermediate,
              shared_intermediate=cfg.shared_expert_intermediate, tokens=t, gflop=round(gflop, 3),
              max_load=round(max_load, 4), twin_fallback=fallback)
  rows, outs = [], {}
  for arm in args.arms.split(","):
    row = dict(base, arm=arm, status="ok", reason="")
    try:
      if arm == "floor":
        fn = floor_arm()
        arm_sets = harness.rotation(lambda i: floor_inputs(cfg, t, p, i, EP), t * cfg.top_k * cfg.hidden * 2)
      elif arm == "floor_bwd":
        if EP > 1:
          raise Unavailable("floor_bwd: the backward's floor is written for EP = 1 only (one GPU's share of "
                            "the backward's GEMMs at EP > 1 is not)")
        fn = floor_bwd_arm()
        arm_sets = harness.rotation(lambda i: floor_bwd_inputs(cfg, t, p, i), t * cfg.top_k * cfg.hidden * 4)
      elif arm in ("train_reference", "train_fused"):
        fn, arm_sets = train_arm(cfg, names, arm.split("_")[1]), sets
      elif arm == "xla_part":
        fn, arm_sets = xla_part_arm(cfg, names), sets
      else:
        launch = MoeLaunch(switching=False) if arm == "fused_fixed" else None
        fn, arm_sets = layer_arm(cfg, names, "reference" if arm == "reference" else "fused", launch), sets
      began = time.strftime("%H:%M:%S")
      arm_gflop = gflop * FLOP_FACTOR.get(arm, 1)
      tm = time_arm(fn, arm_sets, args, arm_gflop)
      # Wall-clock window of the timing, to read beside scripts/gpu_moe.sh's CLOCKS=1 samples.
      print(f"timed {name} {routing} {arm}: {began}-{time.strftime('%H:%M:%S')}", file=sys.stderr)
      if arm not in ("floor", "xla_part") + BACKWARD_ARMS:
        outs[arm] = fn(*sets[0])[0]
      row.update(median_ms=tm.median_ms, min_ms=tm.min_ms, calls=tm.calls_per_rep, reps=tm.reps,
                 tflops=arm_gflop / tm.median_ms, gflop=round(arm_gflop, 3))
      del arm_sets
    except Unavailable as e:
      row.update(status="unavailable", reason=str(e))
    except Exception as e:  # a failing arm must not cost the others' numbers
      row.update(status="failed", reason=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    rows.append(row)
  ms = {r["arm"]: r["median_ms"] for r in rows if r["status"] == "ok"}
  for r in rows:
    if r["status"] != "ok" or r["arm"] in BACKWARD_ARMS:  # a forward's ratios
      continue
    if "floor" in ms:
      r["frac_of_floor"] = ms["floor"] / r["median_ms"]
    if "reference" in ms:
      r["speedup_vs_reference"] = ms["reference"] / r["median_ms"]
    if r["arm"] in outs and "reference" in outs and r["arm"] != "reference":
      y, yr = (np.asarray(outs[a], np.float32) for a in (r["arm"], "reference"))
      r["rel_err_vs_reference"] = float(np.linalg.norm(y - yr) / np.linalg.norm(yr))
  return rows


# MoE spans in kosmos_jax.trace's role slots (kernels/moe/fwd_ops.cuh).
TIMELINE_ROLES = ("build (GEMM tiles)", "move (dispatch)", "reduce (fold)", "wait", "front (route, plan)")
WAIT_FLAGS = ("ready", "counts", "scanned", "planned", "laid_out", "arrived", "gemm1", "gemm2", "returned")


def timeline(name: str, routing: str, args) -> list[str]:
  """One traced fused forward of preset `name` (with --timeline-step: one fused training
  step, jax.grad of the layer: its forward and backward launches and XLA's work between
  them): writes timeline_moe_<name>[_step].{png,json} and returns, per launch, one line per
  role (CTAs, busy CTA-ms, when it first starts and last ends, us from the launch's first
  span), the build spans per GEMM kind and the waits per flag."""
  from kosmos_jax import trace
  trace.traced_module()
  args.out_dir.mkdir(parents=True, exist_ok=True)
  cfg, t = bench_config(name, args), args.tokens
  p = params(cfg)
  names = tuple(n for n in NAMES if n in p)
  fn = (train_arm if args.timeline_step else layer_arm)(cfg, names, "fused")
  ins = (tokens(cfg, t, routing, 0), *[p[n] for n in names])
  for _ in range(3):
    jax.block_until_ready(fn(*ins))
  _, recs, dropped = trace.capture(fn, *ins)
  what = "training step" if args.timeline_step else "moe_forward"
  stem = args.out_dir / f"timeline_moe_{name}{'_step' if args.timeline_step else ''}"
  if not args.timeline_step:  # a step's JSON runs to hundreds of MB
    trace.write_chrome_trace(recs, f"{stem}.json", role_names=TIMELINE_ROLES)
  trace.plot_timeline(recs, f"{stem}.png", role_names=TIMELINE_ROLES,
                      title=f"{what} {name}, {routing}, {t} tokens, EP = 1 ({jax.devices()[0].device_kind})")
  t0 = int(recs["start_ns"].min())
  lines = [f"{name} {routing} {what}: {recs.size} spans ({dropped} dropped), "
           f"{(int(recs['end_ns'].max()) - t0) / 1e3:.1f} us from the first span to the last"]
  directions = ("forward", "backward") if args.timeline_step else ("forward",)
  for direction, launch in zip(directions, _launches(recs, len(directions))):
    lines += _launch_lines(launch, direction, t0)
  if os.environ.get("OUT"):  # the PNG only: the JSON can be tens of MB
    shutil.copy(f"{stem}.png", os.environ["OUT"])
  return lines


def _launches(recs, n: int) -> list:
  """The records split into the call's n launches, at the n - 1 longest gaps in which no
  span is open (XLA's work between launches; a launch's own gaps are shorter)."""
  recs = np.sort(recs, order="start_ns")
  ends = np.maximum.accumulate(recs["end_ns"].astype(np.int64))
  gaps = recs["start_ns"][1:].astype(np.int64) - ends[:-1]
  cut = np.sort(np.argsort(gaps)[::-1][:n - 1]) + 1
  return np.split(recs, cut)


BUILD_KINDS = {"forward": ("", "GEMM1", "GEMM2"), "backward": ("", "dgrad2", "dgrad1", "wgrad2", "wgrad1")}


def _launch_lines(recs, direction: str, origin: int) -> list[str]:
  t0, t1 = int(recs["start_ns"].min()), int(recs["end_ns"].max())
  us = lambda ns: (int(ns) - t0) / 1e3  # noqa: E731
  lines = [f" {direction} launch: {(t1 - t0) / 1e3:.1f} us, from {(t0 - origin) / 1e3:.1f} us"]

  def span_line(label, sel):
    busy = (sel["end_ns"] - sel["start_ns"]).astype(np.int64).sum()
    return (f"  {label:20s} spans {sel.size:6d} CTAs {np.unique(sel['cta']).size:4d} busy {busy / 1e6:8.3f} CTA-ms"
            f"  from {us(sel['start_ns'].min()):8.1f} us to {us(sel['end_ns'].max()):8.1f} us")
  for r, role in enumerate(TIMELINE_ROLES):
    sel = recs[recs["role"] == r]
    if sel.size:
      lines.append(span_line(role, sel))
  builds = recs[recs["role"] == 0]
  for kind, label in enumerate(BUILD_KINDS[direction]):
    sel = builds[builds["tile"] == kind]
    if label and sel.size:
      lines.append(span_line(f"  {label}", sel))
  waits = recs[recs["role"] == 3]
  for f, flag in enumerate(WAIT_FLAGS):  # kernels/moe/fwd_ctl.cuh moe_wait_tile
    sel = waits[(waits["tile"] >> 20) == f]
    if sel.size:
      d = (sel["end_ns"] - sel["start_ns"]).astype(np.int64)
      lines.append(f"  wait {flag:10s} spans {sel.size:6d} busy {d.sum() / 1e6:8.3f} CTA-ms  longest "
                   f"{d.max() / 1e3:8.1f} us  last end {us(sel['end_ns'].max()):8.1f} us")
  return lines


# ---- output ------------------------------------------------------------------------

def _cell(r):
  if r is None:
    return "-"
  if r["status"] != "ok":
    return r["status"]
  tf = r["tflops"]
  return f"{r['median_ms']:.3f} / " + (f"{tf:.0f}" if tf >= 10 else f"{tf:.3g}")


def table(rows, arms) -> str:
  lines = ["| preset | E | routing | max load | " + " | ".join(f"{a} ms / TF/s" for a in arms)
           + " | fused / floor | fused vs reference |",
           "|" + " --- |" * (6 + len(arms))]
  keys = list(dict.fromkeys((r["preset"], r["routing"]) for r in rows))
  for preset, routing in keys:
    by = {r["arm"]: r for r in rows if r["preset"] == preset and r["routing"] == routing}
    any_ = next(iter(by.values()))
    e = (f"{any_['experts']}" if any_["experts"] == any_["experts_preset"]
         else f"{any_['experts']} of {any_['experts_preset']}")
    fused = by.get("fused", {})
    frac = f"{fused['frac_of_floor']:.2f}" if fused.get("frac_of_floor") not in (None, "") else "-"
    speed = f"{fused['speedup_vs_reference']:.2f}x" if fused.get("speedup_vs_reference") not in (None, "") else "-"
    load = f"{any_['max_load']:.2f}" + (" (fallback)" if any_["twin_fallback"] else "")
    lines.append(f"| {preset} | {e} | {routing} | {load} | "
                 + " | ".join(_cell(by.get(a)) for a in arms) + f" | {frac} | {speed} |")
  shared = sorted({r["preset"] for r in rows if r["shared_intermediate"]})
  lines += ["", f"- TFLOP/s count the routed FLOPs 6 t k h I (t = {rows[0]['tokens']} tokens)"
            + (f", plus the shared expert's 6 t h I_s for {', '.join(shared)} (every arm computes it; the floor "
               "with two one-expert grouped GEMMs)" if shared else "") + "; router and SwiGLU not counted.",
            "- floor: the expert GEMMs alone on pre-permuted balanced rows (each expert's padded to 128), "
            "the same for both routings; fused / floor = floor time / fused time.",
            "- floor_bwd: the backward's four expert GEMMs alone on the same rows (dgrad2 with the SwiGLU "
            "backward, wgrad2, dgrad1, wgrad1; the shared expert's too); its TF/s count the backward's FLOPs, "
            "twice the forward's.",
            "- train_*: jax.grad of moe_layer (forward + backward) with impl reference / fused; TF/s count "
            "three forwards' FLOPs.",
            "- xla_part: what the fused arm runs before its launch (routing: XLA ops and the top-k ids' "
            "kernel; aux loss), timed alone; its TF/s counts the whole layer's FLOPs, so read only its ms.",
            "- max load: largest expert count / mean of the router's picks (1.00 = exactly balanced); "
            "(fallback): a count exceeds the twin's capacity, so the reference arm runs its dropless pass."]
  if any(r["experts"] != r["experts_preset"] for r in rows):
    lines.append("- E \"n of N\": the preset's N experts cut to n, each expert's shapes kept (to fit "
                 "--weight-budget of the device's memory, --max-experts, or --dry-run's toy size).")
  fails = [f"{r['preset']} {r['routing']} {r['arm']}: {r['status']} ({r['reason']})"
           for r in rows if r["status"] != "ok"]
  if fails:
    lines += ["", "Not measured:"] + [f"- {f}" for f in dict.fromkeys(fails)]
  return "\n".join(lines)


def plot(rows, arms, path: pathlib.Path) -> None:
  keys = list(dict.fromkeys((r["preset"], r["routing"]) for r in rows))
  series = {}
  for arm in (a for a in arms if a != "xla_part"):  # not a layer: its TF/s mean nothing
    by = {(r["preset"], r["routing"]): r for r in rows if r["arm"] == arm}
    series[arm] = [by[k]["tflops"] if k in by and by[k]["status"] == "ok" else float("nan") for k in keys]
  harness.bar_plot([f"{p} {r}" for p, r in keys], series, path, ylabel="TFLOP/s",
                   title=f"MoE layer forward, EP = 1, {rows[0]['tokens']} tokens, bf16", ref_line=None)


def main(argv=None):
  global EP
  args = parse_args(argv)
  EP = args.ep
  arms = args.arms.split(",")
  routings = ROUTINGS if args.routing == "both" else (args.routing,)
  if args.timeline:
    print("\n".join(timeline(args.timeline, routings[0], args)))
    return 0
  rows, t0 = [], time.time()
  for name in args.presets.split(","):
    for routing in routings:
      rs = bench(name, routing, args)
      rows += rs
      print(f"{time.time() - t0:7.1f}s {name} {routing} (max load {rs[0]['max_load']:.2f}): "
            + ", ".join(f"{r['arm']} {_cell(r)}" for r in rs), flush=True)
      harness.write_csv([{c: r.get(c, "") for c in COLUMNS} for r in rows], args.out_dir / f"moe{args.tag}.csv")
  body = table(rows, arms)
  print(body)
  out = args.out_dir
  env = harness.environment()
  (out / f"moe{args.tag}.md").write_text(f"date {env['date']}; device {env['device']}; commit {env['commit']}; "
                                         f"jax {env['jax']}; command `{env['command']}`\n\n{body}\n")
  files = [out / f"moe{args.tag}.csv", out / f"moe{args.tag}.md"]
  try:
    plot(rows, arms, out / f"moe{args.tag}.png")
    files.append(out / f"moe{args.tag}.png")
  except Exception as e:  # a missing matplotlib must not cost the measured numbers
    print(f"plot skipped: {e!r}")
  if os.environ.get("OUT") and pathlib.Path(os.environ["OUT"]).resolve() != out.resolve():
    for f in files:
      shutil.copy(f, os.environ["OUT"])
  if not (args.dry_run or args.no_append):
    harness.append_results(f"MoE layer forward, EP = {args.ep}, {args.tokens} tokens per GPU: {', '.join(arms)}",
                           body)
  return 0 if all(r["status"] != "failed" for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
