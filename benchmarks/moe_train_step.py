"""Training step of an MoE proxy model on one GPU, fused against reference (issue 28).

A few decoder blocks of a kosmos_jax.moe preset's shapes: RMSNorm, QKV (column-parallel),
causal GQA attention (heads of 128 features, 8 KV heads), O projection (row-parallel),
RMSNorm and the preset's MoE layer (kosmos_jax.moe.moe_layer: router, routed experts, the
shared expert) in place of the MLP, each block with its own weights. The step is jax.grad
of a squared-output loss plus the blocks' aux losses over every weight and the input,
under jax.jit + shard_map on a one-device mesh whose one axis is both the TP and the EP
axis (tp = ep = 1: the kernels run without peers). Arms, timed interleaved
(harness.time_interleaved), bf16:
  reference   impl="reference": XLA's dots, the MoE twin (capped dispatch, batched GEMMs)
  fused       impl="fused": the TP+SP ops and both MoE megakernels
Experts are cut as benchmarks/moe.py cuts them (per-expert shapes kept) so that the
blocks' weights take at most --weight-budget of the device's memory in all (their
gradients as much again). TFLOP/s count the linear layers (6 x tokens x weights, the MoE
layer's routed and shared FLOPs as benchmarks/moe.py counts them) plus attention.

  python3 benchmarks/moe_train_step.py [--preset deepseek-v3] [--layers 2] [--tokens 8192] [--seq 4096]
      [--max-experts N] [--weight-budget 0.12] [--calls 5] [--rounds 5] [--out-dir benchmarks/results]
      [--oracle]
  python3 benchmarks/moe_train_step.py --toy   # CPU: tiny shapes, reference arm: the plumbing only
Writes <out-dir>/moe_train_step_<preset><tag>.csv and prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import types

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import harness  # noqa: E402
import moe as moe_bench  # noqa: E402  (benchmarks/moe.py: presets as benchmarked, parameters, FLOPs)
from train_step import _rms  # noqa: E402

from kosmos_jax import moe, tp  # noqa: E402

BF16 = jnp.bfloat16
HEAD_DIM, KV_HEADS = 128, 8
TOY = dict(tokens=256, seq=128)


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--preset", default="deepseek-v3", choices=sorted(moe.PRESETS))
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--tokens", type=int, default=8192, help="tokens per step")
  ap.add_argument("--seq", type=int, default=4096, help="sequence length (tokens / seq = batch)")
  ap.add_argument("--max-experts", type=int, default=None, help="cut every block to at most this many experts")
  # 0.12: the reference step's activations need most of the rest (at 0.3 DeepSeek-V3's
  # reference step asked XLA for 43.6 GiB more than an H200 had; 0.12 keeps 72 of its
  # 256 experts a block, and the Qwen3 presets' and Llama 4 Scout's whole).
  ap.add_argument("--weight-budget", type=float, default=0.12,
                  help="largest share of device memory all blocks' routed experts' weights may take")
  ap.add_argument("--arms", default=None, help="comma-separated of reference,fused (default both; --toy: reference)")
  ap.add_argument("--calls", type=int, default=5)
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--toy", action="store_true", help="CPU: tiny shapes, reference arm")
  ap.add_argument("--out-dir", default=str(pathlib.Path(__file__).parent / "results"))
  ap.add_argument("--tag", default="")
  ap.add_argument("--oracle", action="store_true",
                  help="also each arm's gradients against the same step in fp32 at the highest matmul "
                       "precision (impl reference; untimed, twice the weights' memory: cut experts to fit)")
  args = ap.parse_args(argv)
  args.arms = (args.arms or ("reference" if args.toy else "reference,fused")).split(",")
  if args.toy:
    args.tokens, args.seq, args.calls, args.rounds = TOY["tokens"], TOY["seq"], 2, 1
  return args


def config(args) -> moe.MoEConfig:
  """The preset as benchmarked (benchmarks/moe.py bench_config), its experts cut so that
  the blocks' routed weights fit the budget together."""
  shim = types.SimpleNamespace(dry_run=args.toy, max_experts=args.max_experts,
                               weight_budget=args.weight_budget / args.layers)
  return moe_bench.bench_config(args.preset, shim)


def heads(cfg: moe.MoEConfig) -> tuple[int, int]:
  return max(cfg.hidden // HEAD_DIM, KV_HEADS), KV_HEADS


def block(wa, wm, x, *, cfg, impl):
  """One decoder block: x [batch, seq, hidden] -> (same, aux loss)."""
  w_qkv, w_o = wa
  nh, nkv = heads(cfg)
  hd = w_o.shape[0] // nh
  qkv = tp.column_parallel_linear(_rms(x), w_qkv, axis_name="tp", impl=impl)
  b, s, _ = qkv.shape
  q, k, v = jnp.split(qkv, [nh * hd, (nh + nkv) * hd], axis=-1)
  attn = jax.nn.dot_product_attention(q.reshape(b, s, nh, hd), k.reshape(b, s, nkv, hd),
                                      v.reshape(b, s, nkv, hd), is_causal=True)
  x = x + tp.row_parallel_linear(attn.reshape(b, s, nh * hd), w_o, axis_name="tp", impl=impl)
  y, aux = moe.moe_layer(_rms(x).reshape(b * s, -1), wm, cfg, axis_name="tp", impl=impl)
  return x + y.reshape(x.shape), aux


def _specs(cfg, layers):
  names = tuple(n for n in moe_bench.NAMES if n in moe_bench.params(cfg))
  moe_spec = {n: P("tp") if n in ("gate_up", "down") else P() for n in names}
  return [((P(), P()), moe_spec)] * layers


def make_step(mesh, cfg, layers, impl):
  def loss(params, x):
    aux_all = jnp.float32(0.0)
    for wa, wm in params:
      x, aux = block(wa, wm, x, cfg=cfg, impl=impl)
      aux_all = aux_all + aux
    return jnp.mean(jnp.square(x.astype(jnp.float32))) + aux_all

  specs = (_specs(cfg, layers), P(None, "tp", None))
  grad = jax.shard_map(jax.grad(loss, argnums=(0, 1)), mesh=mesh, in_specs=specs, out_specs=specs)
  return jax.jit(grad)


def make_inputs(mesh, cfg, layers, tokens, seq, seed):
  h = cfg.hidden
  nh, nkv = heads(cfg)
  k = iter(jax.random.split(jax.random.key(seed), 2 * layers + 1))
  r = lambda shape, scale: (scale * jax.random.normal(next(k), shape, jnp.float32)).astype(BF16)
  params = [((r((h, (nh + 2 * nkv) * HEAD_DIM), h ** -0.5), r((nh * HEAD_DIM, h), h ** -0.5)),
             moe_bench.params(cfg)) for _ in range(layers)]
  x = r((tokens // seq, seq, h), 1.0)
  put = lambda a, sp: jax.device_put(a, jax.sharding.NamedSharding(mesh, sp))
  specs = _specs(cfg, layers)
  params = [((put(wa[0], P()), put(wa[1], P())), {n: put(a, sp[1][n]) for n, a in wm.items()})
            for (wa, wm), sp in zip(params, specs)]
  return params, put(x, P(None, "tp", None))


def flops(cfg, layers, tokens, seq) -> float:
  """One step's FLOPs: forward + backward of the attention part and the MoE layer."""
  h = cfg.hidden
  nh, nkv = heads(cfg)
  attn_w = h * (nh + 2 * nkv) * HEAD_DIM + nh * HEAD_DIM * h
  attn = 2 * 2 * tokens * seq * nh * HEAD_DIM / 2  # causal QK^T and PV, forward
  routed, shared = moe_bench.flops(cfg, tokens)
  return layers * (6 * tokens * attn_w + 3 * attn + 3 * (routed + shared))


def grad_diffs(fused, reference) -> list[tuple[float, str]]:
  """|fused - reference| / |reference| (Frobenius) per gradient, largest first, with its
  path: a routing decision that flips between the paths (bf16 roundings differ, so a later
  block's top-k can differ) moves the router's and the expert weights' gradients most."""
  out = []
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(fused), jax.tree.leaves(reference)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    out.append((float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)), jax.tree_util.keystr(path)))
  return sorted(out, reverse=True)


def oracle_grads(mesh, cfg, layers, inputs):
  """The step's gradients in fp32 at the highest matmul precision (impl reference) on the
  same values: which arm's bf16 gradients are nearer the exact ones. Its routing may pick
  differently from both arms on near-ties, as theirs may from each other's."""
  f32 = jax.tree.map(lambda a: a.astype(jnp.float32), inputs)
  with jax.default_matmul_precision("highest"):
    grads = jax.device_get(make_step(mesh, cfg, layers, "reference")(*f32))
  return grads


def _worst(diffs, n=3) -> str:
  return "; ".join(f"{path} {d:.2e}" for d, path in diffs[:n])


def main(argv=None):
  args = parse_args(argv)
  devs = [d for d in jax.devices() if d.platform == "gpu"][:1] or jax.devices()[:1]
  mesh = jax.sharding.Mesh(np.array(devs), ("tp",))
  cfg = config(args)
  fns = {impl: make_step(mesh, cfg, args.layers, impl) for impl in args.arms}
  sets = [make_inputs(mesh, cfg, args.layers, args.tokens, args.seq, s) for s in range(2)]
  grads = {impl: jax.device_get(f(*sets[0])) for impl, f in fns.items()}
  rel, worst = float("nan"), ""
  if len(grads) == 2:
    diffs = grad_diffs(grads["fused"], grads["reference"])
    rel, worst = diffs[0][0], _worst(diffs)
    print(f"largest relative gradient differences (fused against reference): {worst}")
  vs_oracle = {}
  if args.oracle:
    exact = oracle_grads(mesh, cfg, args.layers, sets[0])
    for impl, g in grads.items():
      diffs = grad_diffs(g, exact)
      vs_oracle[impl] = diffs[0][0]
      print(f"largest relative gradient differences ({impl} against the fp32 oracle): {_worst(diffs)}")
    del exact
  t = harness.time_interleaved(fns, sets, calls=args.calls, rounds=args.rounds)
  tf = flops(cfg, args.layers, args.tokens, args.seq) / 1e12
  row = dict(preset=args.preset, experts=cfg.num_experts, experts_preset=moe.PRESETS[args.preset].num_experts,
             layers=args.layers, tokens=args.tokens, seq=args.seq, device=devs[0].device_kind,
             max_rel_grad_diff=rel, worst_grads=worst)
  row.update({f"{impl}_vs_oracle": d for impl, d in vs_oracle.items()})
  for impl in args.arms:
    row[f"{impl}_ms"] = t[impl].median_ms
    row[f"{impl}_tflops"] = tf / (t[impl].median_ms * 1e-3)
  if len(args.arms) == 2:
    row["speedup"] = t["reference"].median_ms / t["fused"].median_ms
  out = pathlib.Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  harness.write_csv([row], out / f"moe_train_step_{args.preset}{args.tag}.csv")
  cols = " | ".join(f"{impl} ms / TF/s" for impl in args.arms)
  cells = " | ".join(f"{row[f'{impl}_ms']:.3f} / {row[f'{impl}_tflops']:.0f}" for impl in args.arms)
  print(f"| preset | E | blocks | tokens | {cols} | fused speedup | max rel. grad diff |\n"
        f"|{' --- |' * (6 + len(args.arms))}")
  print(f"| {args.preset} | {cfg.num_experts} of {row['experts_preset']} | {args.layers} | {args.tokens} | {cells} | "
        f"{row.get('speedup', float('nan')):.3f} | {rel:.2e} |")


if __name__ == "__main__":
  main()
