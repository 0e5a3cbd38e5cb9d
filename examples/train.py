"""Train a small Llama-style decoder with kosmos_jax TP+SP layers (the README's main job).

A character-level model (RMSNorm, rotary causal attention with heads split over
`tp`, SwiGLU `ParallelMLP`, or with --moe an expert-parallel `MoE`) is trained with
`jax.jit` + optax on a (dp, tp) mesh built from whatever devices exist: 8 virtual
CPU devices by default. At the end the loss curve is checked against an unsharded
twin — the same math with plain `jnp` matmuls on one device, started from the same
parameters and fed the same batches.

    python examples/train.py            # TP+SP MLP
    python examples/train.py --moe      # TP+SP attention, EP experts

The fused MoE kernels take bf16 with hidden and expert widths that are multiples of 128;
on a GPU: KOSMOS_IMPL=fused python examples/train.py --moe --dtype bfloat16 --hidden 128
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from tqdm import tqdm  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import model as model_lib  # noqa: E402
import twin as twin_lib  # noqa: E402

import kosmos_jax  # noqa: E402
from kosmos_jax import ops  # noqa: E402

CORPUS = pathlib.Path(__file__).parent / "data" / "corpus.txt"


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
  p.add_argument("--seq", type=int, default=64)
  p.add_argument("--hidden", type=int, default=64)
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--tp", type=int, default=None, help="default: min(4, devices)")
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--moe", action="store_true", help="replace ParallelMLP by an EP MoE layer (its experts "
                 "as wide as --hidden)")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                 help="the layers' compute dtype (parameters and the residual stream stay fp32)")
  p.add_argument("--parity-tol", type=float, default=None,
                 help="max relative difference of the loss curves vs the unsharded twin (default 1e-3 "
                      "in fp32, where only the reduction order differs and Adam amplifies it slowly "
                      "over steps; 1e-2 in bf16, where a sum rounded in another order can round to a "
                      "neighbouring bf16 value)")
  p.add_argument("--seed", type=int, default=0)
  return p.parse_args(argv)


def make_mesh(tp: int | None):
  n = len(jax.devices())
  tp = tp or min(4, n)
  if n % tp:
    raise ValueError(f"--tp={tp} must divide the number of devices {n}")
  return jax.make_mesh((n // tp, tp), ("dp", "tp"))


def batches(args, seed):
  """Random windows of the corpus, bytes as tokens: (inputs, targets) [batch, seq]."""
  data = np.frombuffer(CORPUS.read_bytes(), np.uint8).astype(np.int32)
  rng = np.random.default_rng(seed)
  while True:
    starts = rng.integers(0, len(data) - args.seq - 1, size=args.batch)
    win = np.stack([data[s:s + args.seq + 1] for s in starts])
    yield win[:, :-1], win[:, 1:]


TP_OPS = ("ag_tn", "tn_rs", "ag_nn", "bulk_ag_nn", "bulk_rs_nt", "matmul")
MOE_OPS = ("moe_forward", "moe_backward")


def path_ran(moe: bool) -> str:
  """Which path each op the model calls takes here under KOSMOS_IMPL (default auto), and why."""
  try:
    chosen = {op: ops.choose(op, None) for op in TP_OPS + (MOE_OPS if moe else ())}
  except NotImplementedError as e:  # KOSMOS_IMPL=fused where a kernel cannot run
    raise SystemExit(str(e)) from None
  # auto decides the MoE ops per call, by the layer's shape (ops.moe_forward's docstring).
  by_shape = [op for op, c in chosen.items() if c == "fused" and op in MOE_OPS and ops.default_impl() == "auto"]
  fused = [op for op, c in chosen.items() if c == "fused" and op not in by_shape]
  ref = [op for op, c in chosen.items() if c == "reference"]
  out = f"fused: {', '.join(fused) or 'none'}; reference twins: {', '.join(ref) or 'none'}"
  if by_shape:
    out += f"; fused where auto's shape rule holds: {', '.join(by_shape)}"
  if ref and ops.default_impl() != "reference":
    state = kosmos_jax.available()
    status = {op: ops.fused_status(op) for op in ref}
    no_kernel = [op for op, (ok, why) in status.items() if not ok and "no fused kernel" in why]
    slower = [op for op in ref if op not in no_kernel and state]
    why = [f"no fused kernel yet for {', '.join(no_kernel)}"] if no_kernel else []
    why += [f"fused kernels unavailable here: {state.reason}"] if not state else []
    why += [f"fused {', '.join(slower)} not yet faster than XLA (impl='fused' forces it)"] if slower else []
    out += f" [{'; '.join(why)}]"
  return out


def train_sharded(args, mesh, model, data, check_every: int = 25):
  """Train; returns (losses, checkpoints): every `check_every` steps the host
  parameters and batch *before* that step, for the twin to evaluate."""
  opt = nnx.Optimizer(model, optax.adam(args.lr), wrt=nnx.Param)

  @nnx.jit
  def step(model, opt, x, y):
    loss, grads = nnx.value_and_grad(lambda m: model_lib.loss_fn(m, x, y))(model)
    opt.update(model, grads)
    return loss

  losses, checks, tokens = [], [], args.batch * args.seq
  bar = tqdm(range(args.steps), desc="kosmos", unit="step")
  t0 = None
  for i in bar:
    x, y = next(data)
    if i % check_every == 0 or i == args.steps - 1:
      checks.append((i, twin_lib.host_params(model), x, y))
    loss = float(step(model, opt, x, y))
    if i == 0:
      t0 = time.perf_counter()  # exclude compilation from tokens/s
    else:
      bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens * i / (time.perf_counter() - t0):,.0f}")
    losses.append(loss)
  return np.array(losses), checks


def main(argv=None):
  args = parse_args(argv)
  if args.parity_tol is None:
    args.parity_tol = 1e-3 if args.dtype == "float32" else 1e-2
  mesh = make_mesh(args.tp)
  cfg = model_lib.Config(vocab=256, hidden=args.hidden, heads=args.heads, layers=args.layers,
                         seq=args.seq, moe=args.moe, expert_intermediate=args.hidden, dtype=args.dtype)
  print(f"devices: {len(jax.devices())} x {jax.devices()[0].platform}, mesh {dict(mesh.shape)}, "
        f"{'MoE (EP over tp)' if args.moe else 'MLP'}, {args.dtype}; path: {path_ran(args.moe)}")
  with jax.set_mesh(mesh):
    model = model_lib.Decoder(cfg, mesh=mesh, rngs=nnx.Rngs(args.seed))
    params0 = twin_lib.host_params(model)
    losses, checks = train_sharded(args, mesh, model, batches(args, args.seed))
  dp = mesh.shape["dp"]
  # 1) Same parameters, same batch: the twin's loss at checkpoints along the run.
  at = np.array([twin_lib.loss(cfg, p, x, y, dp) for _, p, x, y in checks])
  ours = losses[[i for i, *_ in checks]]
  rel = float(np.max(np.abs(ours - at) / np.abs(at)))
  print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; twin at the same parameters, "
        f"{len(checks)} checkpoints: max rel. difference {rel:.2e} (tol {args.parity_tol:.0e})")
  ok_parity = rel <= args.parity_tol
  if not args.moe:
    # 2) Dense model: the twin also trains on its own from the same start and
    # must follow the same curve. (Not for MoE: a last-bit difference in a router
    # logit can flip a top-k choice, after which two exact runs legitimately part.)
    twin = twin_lib.train(cfg, params0, batches(args, args.seed), args.steps, args.lr, dp=dp)
    rel_curve = float(np.max(np.abs(losses - twin) / np.abs(twin)))
    print(f"twin trained alone: {twin[0]:.4f} -> {twin[-1]:.4f}; max rel. difference of the "
          f"curves {rel_curve:.2e} (tol {args.parity_tol:.0e})")
    ok_parity = ok_parity and rel_curve <= args.parity_tol
  ok_down = losses[-1] < 0.7 * losses[0]
  print(f"loss going down: {'OK' if ok_down else 'FAILED'}; parity: {'OK' if ok_parity else 'FAILED'}")
  return 0 if ok_down and ok_parity else 1


if __name__ == "__main__":
  sys.exit(main())
