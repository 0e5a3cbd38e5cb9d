"""The MoE routing's selection kernel (kernels/moe/select.cuh, its rule in
kernels/moe/select.h) against the twin's selection, moe_router.pick, bit for bit on
the same scores: the driver tests/host/moe_select_emu.cc runs the kernel's lane
functions for 32 lanes in lockstep (shuffled each pass), the two warp reductions
done by the driver. Every preset's routing rule and wider ones, on fresh scores,
tie-heavy ones (with -0 and +0 apart, as lax.top_k ranks them) and NaN rows and
entries (+NaN ranks first, as in lax.top_k). Two more checks compile the kernel as
device code: sm_90a with nvcc (no stack frame), and gfx90a/gfx942/gfx950 with the
HIP code-generation check's toolchains. tests/gpu/test_moe_fused.py runs it on a GPU."""
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from host_build import CXX, amdgpu_reports, build, sm90_cubin
from kosmos_jax.reference import moe_router
from kosmos_jax.reference.moe_config import PRESETS, MoEConfig

T = 203  # tokens


def _small(**kw):
  return MoEConfig(hidden=1, expert_intermediate=1, **kw)


RULES = {
    **PRESETS,
    "e60-k4": _small(num_experts=60, top_k=4),
    "e512-k32-g64": _small(num_experts=512, top_k=32, n_groups=64, topk_groups=8, use_expert_bias=True),
    "e72-g8-k6-bias": _small(num_experts=72, top_k=6, score="sigmoid", n_groups=8, topk_groups=3,
                             use_expert_bias=True),
    "e96-g6-k5": _small(num_experts=96, top_k=5, n_groups=6, topk_groups=2),
    "e16-g8-k16": _small(num_experts=16, top_k=16, n_groups=8, topk_groups=8),  # every expert picked
    # Groups of two, one kept: a group's sum of -0 and -0 is +0 (jnp.sum reduces from +0),
    # which ties a group of +0 and -0 and so picks the lower group.
    "e8-g4-k1": _small(num_experts=8, top_k=1, n_groups=4, topk_groups=1),
}


def _scores(cfg: MoEConfig, kind: str, rng):
  e = cfg.num_experts
  s = rng.standard_normal((T, e)).astype(np.float32)
  bias = (0.1 * rng.standard_normal(e)).astype(np.float32)
  if kind == "ties":  # few values, -0 among them: exact ties of experts and of groups
    s = rng.choice(np.float32([-1.0, -0.0, 0.0, 0.5, 2.0]), size=(T, e))
    bias = rng.choice(np.float32([0.0, 0.125, -0.0]), size=e)
  if kind == "nan":
    s[3] = np.nan
    s[7, ::3] = np.nan
    s[11, 1::4] = -np.nan
    s[13, :] = -np.inf
  return s, (bias if cfg.use_expert_bias else None)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
  if CXX is None:
    pytest.skip("no host C++ compiler (g++/c++/clang++) found")
  return build(tmp_path_factory.mktemp("moe_select"), "moe_select_emu.cc", name="moe_select_emu")


@pytest.mark.parametrize("kind", ["random", "ties", "nan"])
@pytest.mark.parametrize("name", sorted(RULES))
def test_selection_matches_the_twin(driver, tmp_path, name, kind):
  cfg = RULES[name]
  s, bias = _scores(cfg, kind, np.random.default_rng(sorted(RULES).index(name) * 3 + len(kind)))
  (tmp_path / "cfg.txt").write_text(f"{T} {cfg.num_experts} {cfg.top_k} {cfg.n_groups} {cfg.topk_groups} "
                                    f"{int(bias is not None)}\n")
  s.tofile(tmp_path / "score.bin")
  if bias is not None:
    bias.tofile(tmp_path / "bias.bin")
  r = subprocess.run([driver, str(tmp_path)], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and "0 failures" in r.stdout, f"driver failed:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
  got = np.fromfile(tmp_path / "idx.bin", np.int32).reshape(T, cfg.top_k)
  want = np.asarray(moe_router.pick(jnp.asarray(s), top_k=cfg.top_k, n_groups=cfg.n_groups,
                                    topk_groups=cfg.topk_groups, bias=None if bias is None else jnp.asarray(bias)))
  bad = np.flatnonzero(np.any(got != want, axis=1))
  assert bad.size == 0, f"{bad.size} tokens differ, first {bad[0]}: got {got[bad[0]]}, twin {want[bad[0]]}"


def test_kernel_compiles_as_sm90_device_code(tmp_path):
  """kernels/moe/select.cuh for sm_90a: its candidates' keys stay in registers."""
  report = sm90_cubin(tmp_path, "moe_select_kernel.cu")
  frames = [line for line in report.splitlines() if "stack frame" in line]
  assert len(frames) == 1 and frames[0].strip().startswith("0 bytes stack frame, 0 bytes spill"), report[-3000:]


def test_kernel_compiles_as_amdgpu_code(tmp_path):
  """The same kernel through the HIP code-generation check's compilers for gfx90a,
  gfx942 and gfx950 (the reductions as shuffles there): no scratch, no calls."""
  reports = amdgpu_reports(tmp_path, "moe_select_kernel.cu")
  for target, reps in reports.items():
    assert [r.name for r in reps] == ["moe_select_kernel"], target
    for r in reps:
      assert r.scratch_bytes == 0 and r.calls == 0 and not r.dynamic_stack, f"{target}: {r}"


def test_twin_ranks_as_the_kernel_documents():
  """The order select.h states is jax.lax.top_k's: +NaN first, +0 before -0, the lower
  id first among equal bits (a change in JAX would show here first)."""
  s = jnp.float32([[0.0, -0.0, 1.0, np.nan, -np.nan, -np.inf, 1.0, -0.0]])
  assert jax.lax.top_k(s, 8)[1].tolist() == [[3, 2, 6, 0, 1, 7, 5, 4]]
