"""Memory and time of DeepSeek-V3's reference MoE layer, forward + backward, on one device.

Builds the DEEPSEEK_V3 preset's layer (256 experts, top-8 of 4-of-8 groups, hidden
7168, expert width 2048, one shared expert, selection bias) at 8192 tokens on a
one-device EP mesh, and runs jax.grad of sum(y * cot) + aux over x and every weight
under jax.jit, bf16, with two routings:
  balanced  random router, zero bias: ~256 rows per expert, within the capacity (512)
  skewed    bias +10 on experts 0-7: every token picks them, 8192 rows each, so the
            capped buffers overflow and the dropless fallback runs
Each routing runs in a process of its own, so that its peak is its own. Prints the
compile time, the median step time, the device's peak_bytes_in_use (where the
platform reports memory_stats) and XLA's own estimate (memory_analysis), and the
layer's routing statistics, which say whether the fallback ran.

  python3 benchmarks/moe_memory_check.py                      # one H200: full size
  python3 benchmarks/moe_memory_check.py --tokens 256 --experts 16 --hidden 64 \\
      --expert-intermediate 32                                  # CPU: scaled down
  python3 benchmarks/moe_memory_check.py --compile-only         # estimate only, no run
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from kosmos_jax import moe  # noqa: E402

GIB = 1 << 30
NAMES = ("router_w", "gate_up", "down", "shared_gate_up", "shared_down", "expert_bias")


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--tokens", type=int, default=8192)
  ap.add_argument("--experts", type=int, default=None, help="scale down (default: the preset's 256)")
  ap.add_argument("--hidden", type=int, default=None, help="scale down (default 7168)")
  ap.add_argument("--expert-intermediate", type=int, default=None, help="scale down (default 2048)")
  ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  ap.add_argument("--calls", type=int, default=3, help="timed steps after the first")
  ap.add_argument("--routing", default="both", choices=("both", "balanced", "skewed"))
  ap.add_argument("--compile-only", action="store_true", help="XLA's estimate only: allocate nothing")
  return ap.parse_args(argv)


def config(args) -> moe.MoEConfig:
  cfg = moe.DEEPSEEK_V3
  e = args.experts or cfg.num_experts
  changes = dict(num_experts=e, top_k=min(cfg.top_k, e))
  if e % cfg.n_groups or e // cfg.n_groups < 2 or changes["top_k"] > cfg.topk_groups * (e // cfg.n_groups):
    changes.update(n_groups=1, topk_groups=1)  # too few experts for the preset's 8 groups
  if args.hidden:
    changes["hidden"] = args.hidden
  if args.expert_intermediate:
    changes.update(expert_intermediate=args.expert_intermediate,
                   shared_expert_intermediate=args.expert_intermediate)
  return cfg.replace(**changes)


def _normal(key, shape, scale, dtype):
  """Drawn one leading slice at a time, so that no fp32 copy of a 15 GB weight exists
  (it would set the peak before the step runs)."""
  draw = lambda k, s: (scale * jax.random.normal(k, s, jnp.float32)).astype(dtype)
  if len(shape) < 3:
    return draw(key, shape)
  return jax.lax.map(lambda k: draw(k, shape[1:]), jax.random.split(key, shape[0]))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def inputs(cfg: moe.MoEConfig, t: int, dtype, skewed: bool):
  """(x, cotangent, params), drawn on the device."""
  e, h, i, si = cfg.num_experts, cfg.hidden, cfg.expert_intermediate, cfg.shared_expert_intermediate
  keys = iter(jax.random.split(jax.random.key(0), 8))
  normal = lambda shape, scale: _normal(next(keys), shape, scale, dtype)
  p = {"router_w": normal((h, e), h ** -0.5), "gate_up": normal((e, h, 2, i), h ** -0.5),
       "down": normal((e, i, h), i ** -0.5), "shared_gate_up": normal((h, 2, si), h ** -0.5),
       "shared_down": normal((si, h), si ** -0.5)}
  bias = jnp.zeros((e,), jnp.float32)
  p["expert_bias"] = bias.at[:cfg.top_k].set(10.0) if skewed else bias
  return normal((t, h), 1.0), normal((t, h), 1.0), p


def step_fn(cfg: moe.MoEConfig):
  """jit(grad) of the layer on a one-device EP mesh, plus its routing statistics."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("ep",))
  specs = {"router_w": P(), "gate_up": P("ep"), "down": P("ep"), "shared_gate_up": P(),
           "shared_down": P(), "expert_bias": P()}

  def local(x, cot, *ps):
    def loss(x, *ws):
      y, aux, stats = moe.moe_layer(x, dict(zip(NAMES, (*ws, ps[-1]))), cfg, axis_name="ep", return_stats=True,
                                    impl="reference")
      return jnp.sum(y.astype(jnp.float32) * cot) + aux, stats
    grads, stats = jax.grad(loss, argnums=tuple(range(len(ps))), has_aux=True)(x, *ps[:-1])
    return grads, stats

  in_specs = (P("ep"), P("ep"), *[specs[n] for n in NAMES])
  out_specs = ((P("ep"), *[specs[n] for n in NAMES[:-1]]), moe.RoutingStats(P(), P(), P(), P()))
  return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


def run_one(args, skewed: bool) -> dict:
  cfg, dtype = config(args), jnp.dtype(args.dtype)
  f = step_fn(cfg)
  t0 = time.perf_counter()
  if args.compile_only:
    x, cot, p = jax.eval_shape(lambda: inputs(cfg, args.tokens, dtype, skewed))
  else:
    x, cot, p = inputs(cfg, args.tokens, dtype, skewed)
  compiled = f.lower(x, cot, *[p[n] for n in NAMES]).compile()
  ma = compiled.memory_analysis()
  out = dict(routing="skewed" if skewed else "balanced", tokens=args.tokens, experts=cfg.num_experts,
             hidden=cfg.hidden, dtype=args.dtype, compile_s=round(time.perf_counter() - t0, 1),
             xla_estimate_gib=round((ma.temp_size_in_bytes + ma.argument_size_in_bytes
                                     + ma.output_size_in_bytes) / GIB, 2) if ma else None)
  if args.compile_only:
    return out
  args_ = (x, cot, *[p[n] for n in NAMES])
  grads, stats = compiled(*args_)
  jax.block_until_ready(grads)
  times = []
  for _ in range(args.calls):
    t1 = time.perf_counter()
    jax.block_until_ready(compiled(*args_))
    times.append((time.perf_counter() - t1) * 1e3)
  mem = jax.devices()[0].memory_stats() or {}
  finite = all(bool(jnp.all(jnp.isfinite(g.astype(jnp.float32)))) for g in grads)
  out.update(step_ms=round(statistics.median(times), 1) if times else None,
             peak_gib=round(mem["peak_bytes_in_use"] / GIB, 2) if "peak_bytes_in_use" in mem else None,
             fallback=bool(stats.dropless_fallback), max_load=round(float(stats.max_load), 2),
             capacity_fill=round(float(stats.capacity_fill), 2), grads_finite=finite)
  return out


def main(argv=None):
  args = parse_args(argv)
  if args.routing != "both":
    print(json.dumps(run_one(args, args.routing == "skewed")))
    return 0
  rows = []
  for routing in ("balanced", "skewed"):  # a process each: peak_bytes_in_use never resets
    cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--routing", routing]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
      sys.stderr.write(done.stderr[-4000:])
      rows.append(dict(routing=routing, error=done.stderr.strip().splitlines()[-1][:300]))
      continue
    rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
  cfg = config(args)
  print(f"DeepSeek-V3 reference MoE layer, forward + backward, {args.tokens} tokens, one "
        f"{jax.devices()[0].device_kind}: E={cfg.num_experts}, k={cfg.top_k}, hidden={cfg.hidden}, "
        f"I={cfg.expert_intermediate}, capacity {cfg.capacity(args.tokens)} rows/expert, {args.dtype}")
  keys = ("routing", "fallback", "max_load", "capacity_fill", "compile_s", "step_ms", "peak_gib",
          "xla_estimate_gib", "grads_finite", "error")
  print("| " + " | ".join(keys) + " |\n|" + " --- |" * len(keys))
  for r in rows:
    print("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
  return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
  sys.exit(main())
