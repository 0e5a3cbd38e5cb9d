"""The fused TP+SP kernels with every rank on one GPU (tests/gpu/loopback_cases.py):
the device protocol at tp = 2, 4 and 8 for both transports (and GEMM+RS's
push_fold) without peer GPUs, forward (ag_tn, tn_rs) and backward (ag_nn,
bulk_ag_nn, bulk_rs_nt).
Each case checks every set's first outputs against the float64 oracle, that
every later call (different inputs than the call before it, poisoned output)
reproduced its set's bits, and that the Hopper builders ran every launch."""
import os

import jax
import numpy as np
import pytest

from kosmos_jax.testing import builder_runs
from helpers import assert_close
import loopback_cases as loopback

BF16 = loopback.BF16


def _sm_count():
  return jax.devices("gpu")[0].core_count


# KOSMOS_FUSED_BUILDERS=portable (read once per process) runs every kernel's
# portable builders instead: the same tests then check those, counted as such.
ENGINE = "portable" if os.environ.get("KOSMOS_FUSED_BUILDERS") == "portable" else "sm90"


def _engine_runs():
  return sum(r[ENGINE] for r in builder_runs().values())


def _check(op, tp, rows, k, n, *, cap=None, calls=6, **kw):
  cap = cap or _sm_count() // tp
  if ENGINE == "portable" and set(kw.get("transports", ("pull",))) != {"pull"}:
    pytest.skip("the push transports need the Hopper builders")
  before = _engine_runs()
  lb = loopback.run(op, tp, rows, k, n, cu_cap=cap, calls=calls, **kw)
  ran = _engine_runs() - before
  assert ran == tp * calls, f"{ENGINE} builders ran {ran} of {tp * calls} launches {kw}"
  assert len(lb.outputs) == kw.get("sets", 2) * (1 if isinstance(op, str) else len(op))
  for (s, o), outs in lb.outputs.items():
    for r, (ys, refs) in enumerate(zip(outs, lb.oracles[s, o])):
      for j, (y, ref) in enumerate(zip(ys, refs)):
        what = f"{o} output {j} tp={tp} set {s} rank {r} {kw}"
        if (o, j) in loopback.EXACT:  # a gather: the input's bits
          assert np.array_equal(np.asarray(y, np.float32), ref.astype(np.float32)), what
        else:
          assert_close(y, ref, BF16, what=what)
  bad = {i: m for i, m in enumerate(lb.mismatches) if m}
  assert not bad, f"{op} tp={tp} {kw}: calls whose bits moved (call: words): {bad}"
  return lb


AG_SHAPES = [(512, 1024, 768), (200, 272, 520), (1024, 2048, 2048)]  # (rows per rank, k, n)
RS_SHAPES = [(512, 1024, 768), (256, 272, 520), (1024, 2048, 2048)]  # (rows per chunk, k, n); rows % 128 == 0


@pytest.mark.parametrize("transport", ["pull", "push"])
@pytest.mark.parametrize("shape", AG_SHAPES, ids=str)
def test_ag_tn_tp2(shape, transport):
  _check("ag_tn", 2, *shape, transports=(transport,))


@pytest.mark.parametrize("transport", ["pull", "push"])
@pytest.mark.parametrize("shape", RS_SHAPES, ids=str)
def test_tn_rs_tp2(shape, transport):
  _check("tn_rs", 2, *shape, transports=(transport,))


@pytest.mark.parametrize("op", ["ag_tn", "tn_rs"])
def test_alternating_transports_same_bits(op):
  # 3 sets x 2 transports: every set's later calls run the other transport too,
  # so a zero mismatch count is push == pull, bit for bit.
  _check(op, 2, 512, 512, 1024, calls=60, sets=3, transports=("push", "pull"))


@pytest.mark.parametrize("op", ["ag_tn", "tn_rs"])
@pytest.mark.parametrize("transport", ["pull", "push"])
def test_grid_of_one_cta_per_rank(op, transport):
  _check(op, 2, 256, 256, 512, cap=1, calls=40, transports=(transport,))


@pytest.mark.parametrize("op", ["ag_tn", "tn_rs"])
@pytest.mark.parametrize("transport", ["pull", "push"])
def test_back_to_back_200_at_a_cap(op, transport):
  _check(op, 2, 512, 512, 1024, cap=20, calls=200, sets=3, transports=(transport,))


@pytest.mark.parametrize("op", ["ag_tn", "tn_rs"])
@pytest.mark.parametrize("transport", ["pull", "push"])
def test_fixed_split(op, transport):
  _check(op, 2, 512, 1024, 1024, calls=8, transports=(transport,), switching=False, knob=4)


@pytest.mark.parametrize("transport", ["pull", "push"])
@pytest.mark.parametrize("stage", [(False, 1), (True, 1), (False, 8)], ids=["fp32", "bf16", "bands8"])
def test_tn_rs_staging_options(stage, transport):
  _check("tn_rs", 2, 1024, 1024, 2048, transports=(transport,), stage_bf16=stage[0], band_rows=stage[1])


@pytest.mark.parametrize("tp", [4, 8])
@pytest.mark.parametrize("op", ["ag_tn", "tn_rs"])
def test_more_ranks_both_transports(op, tp):
  _check(op, tp, 256, 512, 1024, calls=24, sets=3, transports=("push", "pull"))


@pytest.mark.parametrize("tp", [2, 8])
def test_both_kernels_share_the_heap(tp):
  # AG and RS calls in turn on the same heaps (HeapUse hands the data region from
  # one kernel's readers to the other's writers), transports changing every two
  # calls: 4 x 3 = 12 (set, op, transport) phases, each seen 6 times.
  _check(["ag_tn", "tn_rs"], tp, 256, 512, 1024, calls=72, sets=3, transports=("push", "push", "pull", "pull"))


# GEMM+RS push_fold: no reducers; owners sum their chunk in their builders'
# epilogues, own chunk last. Same bits as pull and push.
@pytest.mark.parametrize("shape", RS_SHAPES, ids=str)
def test_tn_rs_fold_tp2(shape):
  _check("tn_rs", 2, *shape, transports=("push_fold",), stage_bf16=True)


@pytest.mark.parametrize("other", ["pull", "push"])
def test_tn_rs_fold_same_bits(other):
  _check("tn_rs", 2, 512, 512, 1024, calls=60, sets=3, transports=("push_fold", other), stage_bf16=True)


@pytest.mark.parametrize("case", ["cta1", "cap20x200", "bands8", "tp4", "tp8"])
def test_tn_rs_fold_edges(case):
  kw = dict(transports=("push_fold", "pull"), stage_bf16=True)
  if case == "cta1":
    _check("tn_rs", 2, 256, 256, 512, cap=1, calls=40, **kw)
  elif case == "cap20x200":
    _check("tn_rs", 2, 512, 512, 1024, cap=20, calls=200, sets=3, **kw)
  elif case == "bands8":
    _check("tn_rs", 2, 1024, 1024, 2048, band_rows=8, **kw)
  else:
    _check("tn_rs", int(case[2:]), 256, 512, 1024, calls=24, sets=3, **kw)


@pytest.mark.skipif(ENGINE == "portable", reason="the portable builders refuse push_fold before its staging (test_refuses_transports_by_name)")
def test_tn_rs_fold_refuses_fp32_staging():
  with pytest.raises(RuntimeError, match="push_fold.*stage='bf16'"):
    loopback.run("tn_rs", 2, 256, 256, 512, cu_cap=8, calls=2, transports=("push_fold",), stage_bf16=False)


def test_refuses_transports_by_name():
  # The hook parses each name once, as the handlers parse their `transport`
  # attribute; an op refuses a transport it lacks, naming the ones it has.
  with pytest.raises(RuntimeError, match="transport='fold' is not one of 'pull', 'push', 'push_fold'"):
    loopback.run("tn_rs", 2, 256, 256, 512, cu_cap=8, calls=2, transports=("pull", "fold"))
  with pytest.raises(RuntimeError, match="kosmos_ag_tn: transport='push_fold' is not supported; the names here "
                                         "are 'pull' and 'push'"):
    loopback.run("ag_tn", 2, 256, 256, 512, cu_cap=8, calls=2, transports=("push_fold",))
  with pytest.raises(RuntimeError, match="kosmos_ag_nn: transport='push' is not supported; the only name here "
                                         "is 'pull'"):
    loopback.run("ag_nn", 2, 256, 256, 512, cu_cap=8, calls=2, transports=("push",))


def test_refuses_ranks_that_cannot_co_reside():
  with pytest.raises(RuntimeError, match=r"cu_cap=100 x tp=2 must be in 1\.\.\d+ SMs"):
    loopback.run("ag_tn", 2, 128, 128, 256, cu_cap=100, calls=1)


# ---- backward kernels ----------------------------------------------------------
# (rows per rank, k, n), csrc/loopback.h's table: ag_nn dy [rows, n] -> dx [tp*rows, k];
# bulk_ag_nn x [rows, k], dy [tp*rows, n]; bulk_rs_nt dxp [tp*rows, k] -> dx [rows, k],
# dw [k, n]. Rows not a multiple of 128, widths not multiples of the tiles, and
# (bulk_rs_nt) chunks whose bytes do not align its bands are included.
BWD_SHAPES = [(512, 1024, 768), (200, 272, 520), (1024, 2048, 2048)]
AG_BWD = ["ag_nn", "bulk_ag_nn"]
BWD = AG_BWD + ["bulk_rs_nt"]


@pytest.mark.parametrize("shape", BWD_SHAPES, ids=str)
@pytest.mark.parametrize("op", BWD)
def test_backward_tp2(op, shape):
  _check(op, 2, *shape)


def test_bulk_rs_nt_unaligned_chunks():
  _check("bulk_rs_nt", 2, 3, 40, 64)


@pytest.mark.parametrize("op", BWD)
def test_backward_grid_of_one_cta_per_rank(op):
  _check(op, 2, 256, 256, 512, cap=1, calls=40)


@pytest.mark.parametrize("op", BWD)
def test_backward_back_to_back_200_at_a_cap(op):
  _check(op, 2, 512, 512, 1024, cap=20, calls=200, sets=3)


@pytest.mark.parametrize("op", BWD)
def test_backward_fixed_split(op):
  _check(op, 2, 512, 1024, 1024, calls=8, switching=False, knob=4)


@pytest.mark.parametrize("tp", [4, 8])
@pytest.mark.parametrize("op", BWD)
def test_backward_more_ranks(op, tp):
  _check(op, tp, 256, 512, 1024, calls=24, sets=3)


@pytest.mark.parametrize("op", ["ag_tn"] + AG_BWD)
def test_ag_batched_rows(op):
  # 3 batches of 80 rows per rank: a 128-row tile row spans batches, so the
  # gathered rows (ag_tn's output rows, the backward ops' gathered outputs) are
  # placed run by run, split at batch boundaries.
  _check(op, 2, 240, 256, 512, m_local=80)


@pytest.mark.parametrize("tp", [2, 4])
def test_ag_nn_batched_whole_tile_rows(tp):
  # 2 batches of 256 rows per rank: whole tile rows of the gathered dY belong to
  # one shard, so (Hopper) the peer tiles read it there at batch-major rows.
  _check("ag_nn", tp, 512, 512, 768, m_local=256, calls=6)


@pytest.mark.parametrize("tp", [2, 8])
def test_a_training_step_shares_the_heap(tp):
  # A column/row pair's fwd and bwd kernels in turn on the same heaps: each
  # hands the data region to the next through HeapUse.
  _check(["ag_tn", "tn_rs", "ag_nn", "bulk_ag_nn", "bulk_rs_nt"], tp, 256, 512, 512, calls=60, sets=3)
