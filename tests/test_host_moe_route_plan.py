"""The MoE forward's route and plan stages (kernels/moe/route.h, kernels/moe/plan.h)
compiled for the host and compared with the pure-JAX twin: the driver
tests/host/moe_route_plan_emu.cc routes fp32 logits written here and plans the
result with several token-block sizes, blocks taken in shuffled orders.

Routing (indices exactly; weights, prob_sum and counts) is compared with
kosmos_jax.reference.moe_router.route, called with x = the logits and an identity
router so that its logits are exactly ours; the plan (pos, counts, overflow) with
kosmos_jax.reference.moe.plan on one device, and its expert-major order with NumPy's
stable argsort. Every preset's router, plus expert counts that are not powers of
two, with random and tie-heavy logits, on a token count that no block size but 1
divides. Two more checks compile the same headers as device code: sm_90a with nvcc,
and gfx90a/gfx942/gfx950 with the HIP code-generation check's toolchains."""
import functools
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from helpers import assert_close
from host_build import CXX, amdgpu_reports, build, sm90_cubin
from kosmos_jax.reference import moe, moe_router
from kosmos_jax.reference.moe_config import PRESETS, MoEConfig

T = 203                              # tokens: prime, so no block size below divides it
ROUTE_BLOCK = 16                     # tokens per routing block (aux partial sums)
BLOCKS = (1, 7, 64, T, T + 5)        # plan block sizes: 1, non-divisors, one block, more than t
TILE = 128                           # the driver's padded segment tile (start128)
DEVICE_KERNELS = {"route_check_kernel", "prob_sum_check_kernel", "plan_histogram_check_kernel",
                  "plan_scan_check_kernel", "plan_scatter_check_kernel"}


def _small(**kw):
  return MoEConfig(hidden=1, expert_intermediate=1, **kw)


CONFIGS = {
    **PRESETS,
    # Shapes the presets lack: E not a power of two, softmax with groups, the widest E.
    "softmax-e60-k4": _small(num_experts=60, top_k=4),
    "softmax-e512-k10-norm": _small(num_experts=512, top_k=10, norm_topk_prob=True),
    "sigmoid-e72-g8-k6": _small(num_experts=72, top_k=6, score="sigmoid", norm_topk_prob=True, n_groups=8,
                                topk_groups=3, route_scale=1.5, use_expert_bias=True),
    "softmax-e96-g6-k5": _small(num_experts=96, top_k=5, n_groups=6, topk_groups=2),
    "sigmoid-e24-k3-bias": _small(num_experts=24, top_k=3, score="sigmoid", use_expert_bias=True),
}

# Tie-heavy values: few distinct logits and biases, so many exact ties of experts and
# of groups. No value's negation is in the set: sigmoid(x) + sigmoid(-x) is 1 only up
# to rounding, and such near-ties would test the exp implementation, not the ranking.
TIE_LOGITS = np.float32([-2.0, -0.75, 0.5, 1.25, 3.0])
TIE_BIAS = np.float32([0.0, 0.125, 0.25])


def _inputs(cfg: MoEConfig, kind: str, rng):
  e = cfg.num_experts
  if kind == "random":
    logits = (2.0 * rng.standard_normal((T, e))).astype(np.float32)
    bias = (0.1 * rng.standard_normal(e)).astype(np.float32)
  else:
    logits = rng.choice(TIE_LOGITS, size=(T, e))
    bias = rng.choice(TIE_BIAS, size=e)
  return logits, (bias if cfg.use_expert_bias else None)


def _run_driver(exe, work, cfg: MoEConfig, logits, bias, caps, seed):
  lines = {"score": int(cfg.score == "sigmoid"), "E": cfg.num_experts, "k": cfg.top_k, "G": cfg.n_groups,
           "TG": cfg.topk_groups, "norm": int(cfg.norm_topk_prob), "scale": repr(cfg.route_scale),
           "has_bias": int(bias is not None), "t": T, "route_block": ROUTE_BLOCK, "seed": seed,
           "blocks": " ".join(map(str, BLOCKS)), "caps": " ".join(map(str, caps))}
  (work / "cfg.txt").write_text("".join(f"{k} {v}\n" for k, v in lines.items()))
  logits.tofile(work / "logits.bin")
  if bias is not None:
    bias.tofile(work / "bias.bin")
  r = subprocess.run([exe, str(work)], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and "0 failures" in r.stdout, f"driver failed:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
  return lambda name, dtype=np.int32: np.fromfile(work / name, dtype)


def _route(cfg: MoEConfig, logits, bias):
  """The twin's route, with an identity router: its logits are ours bit for bit."""
  e = cfg.num_experts
  routing = moe_router.route(jnp.asarray(logits), jnp.eye(e, dtype=jnp.float32), cfg.replace(hidden=e),
                             None if bias is None else jnp.asarray(bias), precision=jax.lax.Precision.HIGHEST)
  assert np.array_equal(np.asarray(routing.logits), logits)
  return routing


@functools.lru_cache(maxsize=None)
def _planner(num_experts: int, n_caps: int):
  """The twin's plan on a one-device EP group, once per capacity (a traced array, so
  one compile serves every capacity)."""
  m = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("ep",))
  plans = lambda i, caps: [moe.plan(i, num_experts=num_experts, capacity=caps[j], axis_name="ep")
                           for j in range(n_caps)]
  return jax.jit(jax.shard_map(plans, mesh=m, in_specs=P(), out_specs=P(), check_vma=False))


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
  if CXX is None:
    pytest.skip("no host C++ compiler (g++/c++/clang++) found")
  return build(tmp_path_factory.mktemp("moe_route_plan"), "moe_route_plan_emu.cc", name="moe_route_plan_emu")


@pytest.mark.parametrize("kind", ["random", "ties"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_route_and_plan_match_the_twin(driver, tmp_path, name, kind):
  cfg = CONFIGS[name]
  seed = sorted(CONFIGS).index(name) * 2 + (kind == "ties")
  rng = np.random.default_rng(1000 + seed)
  logits, bias = _inputs(cfg, kind, rng)
  n, e, k = T * cfg.top_k, cfg.num_experts, cfg.top_k
  routing = _route(cfg, logits, bias)
  most = int(np.max(np.asarray(routing.counts)))
  caps = [most - 1, most]  # overflows by one row; fits exactly
  layouts = _planner(e, len(caps))(routing.indices, jnp.asarray(caps, jnp.int32))
  out = _run_driver(driver, tmp_path, cfg, logits, bias, caps, seed)

  idx = out("indices.bin").reshape(T, k)
  np.testing.assert_array_equal(idx, np.asarray(routing.indices), err_msg=f"{name}/{kind}: indices")
  assert_close(out("weights.bin", np.float32).reshape(T, k), routing.weights, rtol=1e-6,
               what=f"{name}/{kind}: weights")
  assert_close(out("prob_sum.bin", np.float32), routing.prob_sum, rtol=1e-5, what=f"{name}/{kind}: prob_sum")

  flat = idx.reshape(-1)
  order = np.argsort(flat, kind="stable")  # the stable sort's permutation
  counts = np.bincount(flat, minlength=e)
  packed = np.concatenate([[0], np.cumsum(counts)])
  padded = np.concatenate([[0], np.cumsum(-(-counts // TILE) * TILE)])
  for b in BLOCKS:
    tag = f"_{b}.bin"
    np.testing.assert_array_equal(out("counts" + tag), np.asarray(routing.counts), err_msg=f"B={b}: counts")
    pos = out("pos" + tag).reshape(T, k)
    for lay, cap, over in zip(layouts, caps, out("overflow" + tag)):
      np.testing.assert_array_equal(pos, np.asarray(lay.pos), err_msg=f"{name}/{kind} B={b}: pos")
      assert bool(over) == bool(lay.overflow) == (most > cap), f"B={b} capacity {cap}: overflow"
    np.testing.assert_array_equal(out("start1" + tag), packed, err_msg=f"B={b}: packed starts")
    np.testing.assert_array_equal(out("start128" + tag), padded, err_msg=f"B={b}: padded starts")
    rows = out("order" + tag)
    assert rows.shape == (padded[-1],)
    for x in range(e):  # each expert's rows: its pairs in stable order, then -1 padding
      seg = rows[padded[x]:padded[x + 1]]
      np.testing.assert_array_equal(seg[:counts[x]], order[packed[x]:packed[x + 1]], err_msg=f"B={b} e={x}: order")
      assert np.all(seg[counts[x]:] == -1), f"B={b} e={x}: padding rows written"
    assert np.array_equal(np.sort(rows[rows >= 0]), np.arange(n))  # every pair exactly once


def test_stages_compile_as_sm90_device_code(tmp_path):
  """The headers as device code (tests/host/moe_route_plan_kernel.cu): they compile
  for sm_90a, and the route kernel keeps everything in registers (no stack frame)."""
  report = sm90_cubin(tmp_path, "moe_route_plan_kernel.cu")
  frames = [line for line in report.splitlines() if "stack frame" in line]
  assert len(frames) == len(DEVICE_KERNELS) and all(line.strip().startswith("0 bytes stack frame, 0 bytes spill") for line in frames), \
      report[-3000:]


def test_stages_compile_as_amdgpu_code(tmp_path):
  """The same kernels through the HIP code-generation check's compilers (tests/hip/
  hip_codegen.py) for gfx90a, gfx942 and gfx950: no scratch, no calls (expf inlined
  from the device library), no dynamic stack."""
  reports = amdgpu_reports(tmp_path, "moe_route_plan_kernel.cu")
  for target, reps in reports.items():
    assert {r.name for r in reps} == DEVICE_KERNELS, target
    for r in reps:
      assert r.scratch_bytes == 0 and r.calls == 0 and not r.dynamic_stack, f"{target}: {r}"
