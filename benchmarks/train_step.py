"""Training step of a Llama-style TP+SP decoder block, fused against reference.

One block of a Llama-3 preset's shapes: RMSNorm, QKV (column-parallel), causal
attention over this rank's heads, O projection (row-parallel), RMSNorm and the
SwiGLU MLP (column gate|up, row down), all through kosmos_jax.tp, so the forward
runs ag_tn / tn_rs and the backward ag_nn, bulk_ag_nn, bulk_rs_nt and the NT
weight gradient. The step is jax.grad of a squared-output loss over the block's
weights and input under jax.jit + shard_map on a ("tp",) mesh of every visible
GPU (tp = 1 on one GPU: the kernels run without peers; the multi-GPU run is the
one that moves bytes). Arms, timed interleaved (harness.time_interleaved), bf16:
  reference   impl="reference": XLA's collectives + dots (cuBLAS)
  fused       impl="fused": every TP+SP op a kosmos kernel
TFLOP/s counts the block's linear layers (6 x tokens x weights) plus attention.

  python3 benchmarks/train_step.py [--model 8B|70B] [--tokens 8192] [--seq 4096] [--layers-scale 1]
      [--calls 10] [--rounds 5] [--out-dir benchmarks/results] [--tag ""]
Writes <out-dir>/train_step<tag>.csv and prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import harness  # noqa: E402

from kosmos_jax import tp  # noqa: E402

BF16 = jnp.bfloat16
# hidden, heads, kv heads, ffn (Llama 3 8B and 70B)
MODELS = {"8B": (4096, 32, 8, 14336), "70B": (8192, 64, 8, 28672)}


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", default="8B", choices=sorted(MODELS))
  ap.add_argument("--tokens", type=int, default=8192, help="tokens per step (all ranks)")
  ap.add_argument("--seq", type=int, default=4096, help="sequence length (tokens / seq = batch)")
  ap.add_argument("--calls", type=int, default=10)
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--out-dir", default=str(pathlib.Path(__file__).parent / "results"))
  ap.add_argument("--tag", default="")
  return ap.parse_args(argv)


def _rms(x):
  xf = x.astype(jnp.float32)
  return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(x.dtype)


def block(params, x, *, heads, kv_heads, impl):
  """One decoder block on this rank: x [batch, seq/tp, hidden] -> same."""
  w_qkv, w_o, w_gu, w_down = params
  hd = w_o.shape[0] // heads  # local heads x head dim = w_o rows
  qkv = tp.column_parallel_linear(_rms(x), w_qkv, axis_name="tp", impl=impl)  # [b, s, (h + 2 kv) hd]
  b, s, _ = qkv.shape
  q, k, v = jnp.split(qkv, [heads * hd, (heads + kv_heads) * hd], axis=-1)
  attn = jax.nn.dot_product_attention(q.reshape(b, s, heads, hd), k.reshape(b, s, kv_heads, hd),
                                      v.reshape(b, s, kv_heads, hd), is_causal=True)
  x = x + tp.row_parallel_linear(attn.reshape(b, s, heads * hd), w_o, axis_name="tp", impl=impl)
  return x + tp.parallel_swiglu_mlp(_rms(x), w_gu, w_down, axis_name="tp", impl=impl)


def make_step(mesh, dims, impl):
  hidden, heads, kv_heads, ffn = dims
  n = mesh.shape["tp"]
  lh, lkv = heads // n, max(kv_heads // n, 1)

  def loss(params, x):
    y = block(params, x, heads=lh, kv_heads=lkv, impl=impl)
    return jnp.mean(jnp.square(y.astype(jnp.float32)))

  specs = ((P(None, "tp"), P("tp", None), P(None, None, "tp"), P("tp", None)), P(None, "tp", None))
  grad = jax.shard_map(jax.grad(loss, argnums=(0, 1)), mesh=mesh, in_specs=specs, out_specs=specs)
  return jax.jit(grad)


def make_inputs(mesh, dims, tokens, seq, seed):
  hidden, heads, kv_heads, ffn = dims
  hd = hidden // heads
  k = iter(jax.random.split(jax.random.key(seed), 8))
  r = lambda shape, scale: (scale * jax.random.normal(next(k), shape, jnp.float32)).astype(BF16)
  params = (r((hidden, (heads + 2 * kv_heads) * hd), hidden ** -0.5), r((heads * hd, hidden), hidden ** -0.5),
            r((hidden, 2, ffn), hidden ** -0.5), r((ffn, hidden), ffn ** -0.5))
  x = r((tokens // seq, seq, hidden), 1.0)
  put = lambda a, sp: jax.device_put(a, jax.sharding.NamedSharding(mesh, sp))
  specs = ((P(None, "tp"), P("tp", None), P(None, None, "tp"), P("tp", None)), P(None, "tp", None))
  return (tuple(put(a, sp) for a, sp in zip(params, specs[0])), put(x, specs[1]))


def flops(dims, tokens, seq):
  hidden, heads, kv_heads, ffn = dims
  hd = hidden // heads
  weights = hidden * (heads + 2 * kv_heads) * hd + heads * hd * hidden + 3 * hidden * ffn
  attn = 2 * 2 * tokens * seq * heads * hd / 2  # causal QK^T and PV, forward
  return 6 * tokens * weights + 3 * attn


def main(argv=None):
  args = parse_args(argv)
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  devs = gpus or jax.devices()
  mesh = jax.sharding.Mesh(np.array(devs), ("tp",))
  dims = MODELS[args.model]
  fns = {impl: make_step(mesh, dims, impl) for impl in ("reference", "fused")}
  sets = [make_inputs(mesh, dims, args.tokens, args.seq, s) for s in range(2)]
  # Parity first: the same step, the same inputs, both paths.
  g_ref, g_fused = (jax.device_get(fns[i](*sets[0])) for i in ("reference", "fused"))
  rel = max(float(np.linalg.norm(np.asarray(a, np.float32) - np.asarray(b, np.float32)) /
                  max(np.linalg.norm(np.asarray(b, np.float32)), 1e-30))
            for a, b in zip(jax.tree.leaves(g_fused), jax.tree.leaves(g_ref)))
  t = harness.time_interleaved(fns, sets, calls=args.calls, rounds=args.rounds)
  tf = flops(dims, args.tokens, args.seq) / 1e12
  row = dict(model=args.model, tp=len(devs), tokens=args.tokens, seq=args.seq, device=devs[0].device_kind,
             reference_ms=t["reference"].median_ms, fused_ms=t["fused"].median_ms,
             speedup=t["reference"].median_ms / t["fused"].median_ms,
             reference_tflops=tf / (t["reference"].median_ms * 1e-3) / len(devs),
             fused_tflops=tf / (t["fused"].median_ms * 1e-3) / len(devs), max_rel_grad_diff=rel)
  out = pathlib.Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  harness.write_csv([row], out / f"train_step{args.tag}.csv")
  print("| model | tp | tokens | reference ms | fused ms | fused / reference speedup | TFLOP/s per GPU ref / fused "
        "| max rel. grad diff |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
  print(f"| {args.model} | {row['tp']} | {args.tokens} | {row['reference_ms']:.3f} | {row['fused_ms']:.3f} | "
        f"{row['speedup']:.3f} | {row['reference_tflops']:.0f} / {row['fused_tflops']:.0f} | {rel:.2e} |")


if __name__ == "__main__":
  main()
