"""Fused AG+GEMM with Hopper builders (kernels/tp/ag_gemm_sm90.cuh) on 2 GPUs of
one process, against the reference twin and a float64 oracle. Every test checks
that the Hopper builders actually ran (builder_runs), so a silent fall back to
the portable builders fails. Outputs are NaN-poisoned (tests/gpu/conftest.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kosmos_jax import AgConfig, ops, reference
from kosmos_jax.testing import builder_runs
from helpers import P, assert_close, fresh, gpu_mesh, put, shard_map

BF16 = jnp.bfloat16
OUT = P("tp", None, None)  # each device's gathered product, stacked along batch


def _fn(mesh, **kw):
  f = shard_map(lambda a, b: ops.ag_tn(a, b, axis_name="tp", impl="fused", config=AgConfig(**kw)), mesh,
                in_specs=(P(None, "tp", None), P()), out_specs=OUT)
  return lambda x, w: f(put(x, mesh, P(None, "tp", None)), put(w, mesh, P()))


def _oracle(x, w):
  return np.asarray(jnp.asarray(x, jnp.float32), np.float64) @ np.asarray(jnp.asarray(w, jnp.float32), np.float64)


def _sm90_runs():
  return builder_runs()["ag_tn"]["sm90"]


def _check(mesh, x, w, **kw):
  tp = mesh.shape["tp"]
  before = _sm90_runs()
  y = _fn(mesh, **kw)(x, w)
  y.block_until_ready()
  assert _sm90_runs() - before == tp, f"Hopper builders ran {_sm90_runs() - before} of {tp} launches {kw}"
  twin = shard_map(lambda a, b: reference.ag_tn(a, b, axis_name="tp"), mesh,
                   in_specs=(P(None, "tp", None), P()), out_specs=OUT)(put(x, mesh, P(None, "tp", None)),
                                                                      put(w, mesh, P()))
  oracle = _oracle(x, w)
  for rank, (got, ref) in enumerate(zip(np.split(np.asarray(y, np.float32), tp),
                                        np.split(np.asarray(twin, np.float32), tp))):
    assert_close(got, ref, BF16, what=f"sm90 fused vs twin, rank {rank} {kw}")
    assert_close(got, oracle, BF16, what=f"sm90 fused vs oracle, rank {rank} {kw}")


SHAPES = [  # (batch, m total, k, n)
    (1, 2048, 512, 1024),   # whole tiles
    (1, 1000, 264, 520),    # partial tile rows and columns, k not a multiple of 64
    (3, 400, 128, 256),     # batch boundaries inside tile rows
    (1, 4096, 1024, 3072),  # several swizzle bands per shard
]


@pytest.mark.parametrize("b,m,k,n", SHAPES)
def test_sm90_matches_twin_and_oracle(b, m, k, n):
  mesh = gpu_mesh(2, hopper=True)
  _check(mesh, fresh((b, m, k), BF16), fresh((k, n), BF16, scale=k ** -0.5))


@pytest.mark.parametrize("kw", [dict(cu_cap=1), dict(cu_cap=7), dict(movers=0), dict(cu_cap=5, movers=5),
                                dict(movers=32), dict(movers=4, switching=False),
                                dict(cu_cap=2, movers=2, switching=False)],
                         ids=["grid1", "cap7", "movers0-runs-as-1", "all-movers", "movers32", "fixed-split",
                              "fixed-split-grid2"])
def test_sm90_grids(kw):
  mesh = gpu_mesh(2, hopper=True)
  _check(mesh, fresh((1, 1536, 384), BF16), fresh((384, 768), BF16, scale=0.05), **kw)


def test_sm90_back_to_back_fresh_inputs():
  """50 pipelined calls with new inputs: epochs, the done handshake and the TMA
  reads of the gather slots must keep every call's rows apart."""
  mesh = gpu_mesh(2, hopper=True)
  f = _fn(mesh)
  ins = [(fresh((1, 1024, 256), BF16), fresh((256, 512), BF16, scale=1 / 16)) for _ in range(50)]
  outs = [f(x, w) for x, w in ins]  # one sync at the end
  for i, ((x, w), y) in enumerate(zip(ins, outs)):
    for rank, got in enumerate(np.split(np.asarray(y, np.float32), 2)):
      assert_close(got, _oracle(x, w), BF16, what=f"back-to-back call {i}, rank {rank}")


@pytest.mark.parametrize("transport", ["pull", "push"])
def test_sm90_scan_200_calls_grid1_and_cap(transport):
  """200 launches inside one jitted scan, at grid 1 and at a CU cap."""
  mesh = gpu_mesh(2, hopper=True)
  for kw in (dict(cu_cap=1, transport=transport), dict(cu_cap=7, transport=transport)):
    def body(c, _, kw=kw):
      y = ops.ag_tn(c[0], c[1], axis_name="tp", impl="fused", config=AgConfig(**kw))
      return c, y[:, :8, :8].astype(jnp.float32).sum()
    f = shard_map(lambda x, w: jax.lax.scan(body, (x, w), None, length=200)[1][None], mesh,
                  in_specs=(P(None, "tp", None), P()), out_specs=P("tp"))
    x, w = fresh((1, 512, 128), BF16), fresh((128, 256), BF16, scale=0.1)
    sums = np.asarray(f(put(x, mesh, P(None, "tp", None)), put(w, mesh, P())))
    block = _oracle(x, w)[0, :8, :8]  # error scales with the magnitudes (see test_tn_rs_sm90)
    assert np.all(np.isfinite(sums)) and np.allclose(sums, sums[0, 0]), f"{kw}: sums move across calls"
    assert abs(sums[0, 0] - block.sum()) <= 1e-2 * np.abs(block).sum(), (kw, sums[0, 0], block.sum())


def test_sm90_single_device_group():
  mesh = gpu_mesh(1, hopper=True)
  _check(mesh, fresh((2, 200, 64), BF16), fresh((64, 72), BF16, scale=0.125))


def test_grad_through_fused_op():
  """jax.grad through ops.ag_tn(impl="fused") (the FFI primitive has no derivative
  rule; ops give it its twin's, tests/test_fused_ad.py): the forward runs the Hopper
  builders, and dx, dw equal the reference op's gradients."""
  mesh = gpu_mesh(2, hopper=True)
  x, w = fresh((1, 1024, 512), BF16), fresh((512, 512), BF16, scale=512 ** -0.5)
  specs, out = (P(None, "tp", None), P(None, "tp")), P(None, None, "tp")
  cot = fresh((1, 1024, 512), BF16)
  args = (put(x, mesh, specs[0]), put(w, mesh, specs[1]))

  def grads(impl):
    f = shard_map(lambda a, b: ops.ag_tn(a, b, axis_name="tp", impl=impl), mesh, specs, out)
    loss = lambda a, b: jnp.vdot(f(a, b).astype(jnp.float32), cot.astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1))(*args)

  before = _sm90_runs()
  got = grads("fused")
  assert _sm90_runs() - before == 2, "the forward of the fused grad did not run the Hopper builders"
  for g, r, name in zip(got, grads("reference"), ("dx", "dw")):
    assert_close(g, r, BF16, what=f"ag_tn fused grad {name}")


# ---- push transport (AgConfig.transport="push"): movers write their rows into the
# peers' gather slots; the peers' builders acquire them at system scope.

@pytest.mark.parametrize("b,m,k,n", SHAPES)
def test_sm90_push_matches_twin_and_oracle(b, m, k, n):
  mesh = gpu_mesh(2, hopper=True)
  _check(mesh, fresh((b, m, k), BF16), fresh((k, n), BF16, scale=k ** -0.5), transport="push")


@pytest.mark.parametrize("kw", [dict(cu_cap=1), dict(cu_cap=7), dict(movers=0), dict(movers=8),
                                dict(movers=4, switching=False), dict(cu_cap=2, movers=1, switching=False)],
                         ids=["grid1", "cap7", "movers0-runs-as-1", "movers8", "fixed-split", "fixed-split-grid2"])
def test_sm90_push_grids(kw):
  mesh = gpu_mesh(2, hopper=True)
  _check(mesh, fresh((1, 1536, 384), BF16), fresh((384, 768), BF16, scale=0.05), transport="push", **kw)


def test_sm90_push_and_pull_back_to_back():
  """60 pipelined calls with new inputs, the transport alternating every call and
  every third one at grid 1: a fast rank's pushes of call i+1 must not land in a
  slot its peer still reads for call i (ready[] handshake), across transports too."""
  mesh = gpu_mesh(2, hopper=True)
  fns = {(t, g): _fn(mesh, transport=t, **({"cu_cap": 1} if g else {})) for t in ("push", "pull") for g in (0, 1)}
  ins = [(fresh((1, 1024, 256), BF16), fresh((256, 512), BF16, scale=1 / 16)) for _ in range(60)]
  outs = [fns[("push" if i % 2 == 0 else "pull", i % 3 == 0)](x, w) for i, (x, w) in enumerate(ins)]
  for i, ((x, w), y) in enumerate(zip(ins, outs)):
    for rank, got in enumerate(np.split(np.asarray(y, np.float32), 2)):
      assert_close(got, _oracle(x, w), BF16, what=f"push/pull call {i}, rank {rank}")


def test_push_needs_hopper_builders():
  """f32 runs the portable builders, which cannot push: a clear error, not a pull."""
  mesh = gpu_mesh(2, hopper=True)
  with pytest.raises(Exception, match="transport='push' needs the Hopper builders"):
    _fn(mesh, transport="push")(fresh((1, 512, 128), jnp.float32), fresh((128, 256), jnp.float32)).block_until_ready()
