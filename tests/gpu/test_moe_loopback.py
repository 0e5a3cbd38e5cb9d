"""The MoE megakernels over an EP group with every rank on one GPU (the loopback
hook, csrc/loopback.h): EP 2, 4 and 8, each rank a concurrent launch with its own
symmetric heap, pushing rows into its peers' arenas and their outputs back.
Forward: each rank's output is checked against a dense per-token oracle, bit for bit
against the same tokens through the EP = 1 launch (a row's expert output and its fold
do not depend on where the row was computed), and every later call (other routing,
poisoned outputs) must reproduce its set's bits. Backward (each call after the
forward of its set, whose workspace it reads): each rank's dX and its experts' dW1,
dW2 against a dense oracle, and bit for bit against the EP = 1 launch over every
rank's tokens at once (an expert's rows then come in the same order: source-major)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_close
from kosmos_jax.testing import builder_runs
from kosmos_jax.testing import loopback

BF16 = jnp.bfloat16
H, I = 256, 128


def _sm_count():
  return jax.devices("gpu")[0].core_count


def _bf16(a):
  return np.asarray(np.asarray(a, np.float32).astype(BF16), np.float32)


def _routing(rng, t, k, e, skew):
  """indices [t, k] (distinct experts per token) and fp32 weights; skew: most pairs
  go to the first experts (one rank's), so one owner's segments are long."""
  if skew:
    p = np.full(e, 0.2 / max(e - 2, 1))
    p[:2] = 0.4
    p = p / p.sum()
  idx = np.stack([rng.choice(e, size=k, replace=False, p=p if skew else None) for _ in range(t)])
  return idx.astype(np.int32), rng.uniform(0.1, 1.0, (t, k)).astype(np.float32)


def _oracle(x, idx, w, w1, w2, input_gating):
  """y [t, H]: each pair's expert output rounded as the kernel rounds (bf16 SwiGLU
  activations, bf16 rows), folded in fp32 and rounded once."""
  acc = np.zeros((x.shape[0], H), np.float64)
  for e in range(w1.shape[0]):
    tok, slot = np.nonzero(idx == e)
    if tok.size == 0:
      continue
    rows = x[tok]
    if input_gating:
      rows = _bf16(w[tok, slot][:, None] * rows)
    h = rows.astype(np.float64) @ w1[e].astype(np.float64)
    g, u = h[:, :I], h[:, I:]
    a = _bf16(g / (1 + np.exp(-g)) * u)
    ye = _bf16(a.astype(np.float64) @ w2[e].astype(np.float64))
    acc[tok] += (1.0 if input_gating else w[tok, slot][:, None]) * ye
  return _bf16(acc)


def _sets(rng, ep, t, k, e, n_sets, skew, input_gating):
  """Input sets [set][rank] for ep ranks (each rank's experts' weights; dY last, which
  only the backward reads), the global weights, and each set's per-rank (x, idx, w, dy)."""
  w1 = _bf16(rng.normal(0, 1 / np.sqrt(H), (e, H, 2 * I)))
  w2 = _bf16(rng.normal(0, 1 / np.sqrt(I), (e, I, H)))
  el = e // ep
  sets, raw = [], []
  for _ in range(n_sets):
    ranks, rr = [], []
    for r in range(ep):
      x = _bf16(rng.normal(0, 1, (t, H)))
      idx, w = _routing(rng, t, k, e, skew)
      dy = _bf16(rng.normal(0, 1, (t, H)))
      ranks.append([x.astype(BF16), idx, w, w1[r * el:(r + 1) * el].astype(BF16),
                    w2[r * el:(r + 1) * el].astype(BF16), dy.astype(BF16)])
      rr.append((x, idx, w, dy))
    sets.append(ranks)
    raw.append(rr)
  return sets, raw, w1, w2


def _outputs(buf, t, k):
  y = np.frombuffer(buf[:t * H * 2], BF16).reshape(t, H).astype(np.float32)
  return y, np.frombuffer(buf[t * H * 2:], np.int32).reshape(t, k)


def _run(ep, t, k, e, sets, *, cap, calls, input_gating, movers=-1):
  before = sum(builder_runs()["moe_forward"].values())
  first, mism, _ = loopback.run(["moe_forward"], ep, t, H, 0, sets, cu_cap=cap, calls=calls, knob=movers,
                                moe=(e, k, I, int(input_gating)))
  assert sum(builder_runs()["moe_forward"].values()) - before == ep * calls
  return first, mism


CASES = {  # (ep, tokens per rank, top_k, experts, skew, input gating)
    "ep2": (2, 384, 4, 16, False, False),
    "ep4": (4, 384, 4, 16, False, False),
    "ep8": (8, 256, 4, 16, False, False),
    "ep8_k_above_local": (8, 256, 4, 8, False, False),   # E_l = 1 < k
    "ep4_skewed": (4, 384, 4, 16, True, False),
    "ep2_input_gating": (2, 384, 1, 16, False, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ep_loopback_matches_oracle_and_ep1(case):
  ep, t, k, e, skew, gating = CASES[case]
  rng = np.random.default_rng(abs(hash(case)) % 2**32)
  sets, raw, w1, w2 = _sets(rng, ep, t, k, e, 2, skew, gating)
  cap = _sm_count() // ep
  first, mism = _run(ep, t, k, e, sets, cap=cap, calls=2 * 3, input_gating=gating)
  bad = {i: m for i, m in enumerate(mism) if m}
  assert not bad, f"{case}: calls whose bits moved (call: words): {bad}"
  for s in range(2):
    for r in range(ep):
      x, idx, w, _ = raw[s][r]
      y, _ = _outputs(first[s][r], t, k)
      assert_close(y, _oracle(x, idx, w, w1, w2, gating), BF16, what=f"{case} set {s} rank {r}")
      # The same tokens through the EP = 1 launch, every expert local: the same bits.
      one = [[[x.astype(BF16), idx, w, w1.astype(BF16), w2.astype(BF16)]]]
      f1, _ = _run(1, t, k, e, one, cap=cap, calls=1, input_gating=gating)
      y1, _ = _outputs(f1[0][0], t, k)
      assert np.array_equal(y.view(np.uint32), y1.view(np.uint32)), f"{case} set {s} rank {r}: EP={ep} != EP=1 bits"


@pytest.mark.parametrize("cap", [1, 3])
def test_ep2_small_grid_same_bits(cap):
  """A grid of one CTA per rank (its mover builds and pushes too) and of three."""
  rng = np.random.default_rng(7 + cap)
  sets, _, _, _ = _sets(rng, 2, 256, 4, 16, 1, False, False)
  ref, _ = _run(2, 256, 4, 16, sets, cap=_sm_count() // 2, calls=1, input_gating=False)
  got, mism = _run(2, 256, 4, 16, sets, cap=cap, calls=2, input_gating=False)
  assert not any(mism)
  for r in range(2):
    assert got[0][r] == ref[0][r], f"cu_cap={cap} rank {r}: bits differ from the full grid"


def test_ep4_200_back_to_back_calls_changing_routing():
  rng = np.random.default_rng(11)
  sets, _, _, _ = _sets(rng, 4, 256, 4, 16, 4, False, False)
  _, mism = _run(4, 256, 4, 16, sets, cap=_sm_count() // 4, calls=200, input_gating=False)
  bad = {i: m for i, m in enumerate(mism) if m}
  assert not bad, f"calls whose bits moved (call: words): {bad}"


# ---- the backward ----------------------------------------------------------------


def _bwd_oracle(x, idx, w, dy, w1, w2, input_gating):
  """(dx [t, H], dw1 [E, H, 2I], dw2 [E, I, H]) of one rank's tokens, each pair's
  rows rounded where the kernels round them: the sent dY row (output gating: w dY)
  and X row (input gating: w x), the forward's bf16 pre-activations and activations,
  d(gate | up) and the dX rows; sums in float64."""
  t = x.shape[0]
  dx = np.zeros((t, H))
  dw1, dw2 = np.zeros(w1.shape), np.zeros(w2.shape)
  for e in range(w1.shape[0]):
    tok, slot = np.nonzero(idx == e)
    if tok.size == 0:
      continue
    we = w[tok, slot][:, None]
    xr = _bf16(we * x[tok]) if input_gating else x[tok]
    dr = dy[tok] if input_gating else _bf16(we * dy[tok])
    h = _bf16(xr.astype(np.float64) @ w1[e].astype(np.float64))
    g, u = h[:, :I].astype(np.float64), h[:, I:].astype(np.float64)
    sg = 1 / (1 + np.exp(-g))
    act = _bf16(g * sg * u)
    da = dr.astype(np.float64) @ w2[e].T.astype(np.float64)
    dh = _bf16(np.concatenate([da * u * sg * (1 + g * (1 - sg)), da * g * sg], axis=1))
    dxr = _bf16(dh.astype(np.float64) @ w1[e].T.astype(np.float64))
    np.add.at(dx, tok, (we if input_gating else 1.0) * dxr)
    dw1[e] = xr.T.astype(np.float64) @ dh
    dw2[e] = act.T.astype(np.float64) @ dr
  return _bf16(dx), dw1, dw2


def _bwd_outputs(buf, t, k, el):
  """dx [t, H], dw1 [E_l, H, 2I], dw2 [E_l, I, H] (float32) and pair_row [t, k]."""
  sizes = (t * H, el * H * 2 * I, el * I * H)
  out, at = [], 0
  for n in sizes:
    out.append(np.frombuffer(buf[at:at + 2 * n], BF16).astype(np.float32))
    at += 2 * n
  dx, dw1, dw2 = out
  return (dx.reshape(t, H), dw1.reshape(el, H, 2 * I), dw2.reshape(el, I, H),
          np.frombuffer(buf[at:], np.int32).reshape(t, k))


def _run_bwd(ep, t, k, e, sets, *, cap, calls, input_gating):
  """calls pairs of (forward, backward) launches; the backward's first outputs and the
  mismatches of every backward call."""
  before = sum(builder_runs()["moe_backward"].values())
  first, mism, _ = loopback.run(["moe_forward", "moe_backward"], ep, t, H, 0, sets, cu_cap=cap, calls=2 * calls,
                                moe=(e, k, I, int(input_gating)))
  assert sum(builder_runs()["moe_backward"].values()) - before == ep * calls
  assert not any(mism), f"calls whose bits moved (call: words): { {i: m for i, m in enumerate(mism) if m} }"
  return first[1::2]  # [set][rank]: the backward's


BWD_CASES = {  # (ep, tokens per rank, top_k, experts, skew, input gating)
    "ep2": (2, 384, 4, 16, False, False),
    "ep4_skewed": (4, 256, 4, 16, True, False),
    "ep8": (8, 256, 4, 16, False, False),
    "ep8_k_above_local": (8, 128, 4, 8, False, False),  # E_l = 1 < k
    "ep2_input_gating": (2, 384, 1, 16, False, True),
}


@pytest.mark.parametrize("case", list(BWD_CASES))
def test_ep_backward_matches_oracle_and_ep1(case):
  ep, t, k, e, skew, gating = BWD_CASES[case]
  el = e // ep
  rng = np.random.default_rng(abs(hash("bwd" + case)) % 2**32)
  sets, raw, w1, w2 = _sets(rng, ep, t, k, e, 2, skew, gating)
  cap = _sm_count() // ep
  got = _run_bwd(ep, t, k, e, sets, cap=cap, calls=2 * 2, input_gating=gating)
  for s in range(2):
    # Every rank's tokens through one EP = 1 launch: the same bits for dX and each expert's dW.
    cat = [np.concatenate([raw[s][r][j] for r in range(ep)]) for j in range(4)]
    one = [[[cat[0].astype(BF16), cat[1], cat[2], w1.astype(BF16), w2.astype(BF16), cat[3].astype(BF16)]]]
    dx1, dw1_1, dw2_1, _ = _bwd_outputs(_run_bwd(1, ep * t, k, e, one, cap=cap, calls=1, input_gating=gating)[0][0],
                                        ep * t, k, e)
    for r in range(ep):
      x, idx, w, dy = raw[s][r]
      dx, dw1, dw2, _ = _bwd_outputs(got[s][r], t, k, el)
      want_dx, _, _ = _bwd_oracle(x, idx, w, dy, w1, w2, gating)
      assert_close(dx, want_dx, BF16, what=f"{case} set {s} rank {r} dx")
      mine = slice(r * el, (r + 1) * el)
      assert np.array_equal(dx.view(np.uint32), dx1[r * t:(r + 1) * t].view(np.uint32)), \
          f"{case} set {s} rank {r}: dx at EP={ep} != EP=1 bits"
      assert np.array_equal(dw1.view(np.uint32), dw1_1[mine].view(np.uint32)), \
          f"{case} set {s} rank {r}: dW1 at EP={ep} != EP=1 bits"
      assert np.array_equal(dw2.view(np.uint32), dw2_1[mine].view(np.uint32)), \
          f"{case} set {s} rank {r}: dW2 at EP={ep} != EP=1 bits"
    # The weight gradients sum every rank's pairs: one oracle over all tokens.
    _, want_dw1, want_dw2 = _bwd_oracle(*cat, w1, w2, gating)
    assert_close(dw1_1, want_dw1, BF16, what=f"{case} set {s} dW1")
    assert_close(dw2_1, want_dw2, BF16, what=f"{case} set {s} dW2")


@pytest.mark.parametrize("cap", [1, 3])
def test_ep2_backward_small_grid_same_bits(cap):
  rng = np.random.default_rng(17 + cap)
  sets, _, _, _ = _sets(rng, 2, 256, 4, 16, 1, False, False)
  ref = _run_bwd(2, 256, 4, 16, sets, cap=_sm_count() // 2, calls=1, input_gating=False)
  got = _run_bwd(2, 256, 4, 16, sets, cap=cap, calls=2, input_gating=False)
  for r in range(2):
    assert got[0][r] == ref[0][r], f"cu_cap={cap} rank {r}: backward bits differ from the full grid"


def test_ep4_backward_200_back_to_back_calls_changing_routing():
  """100 (forward, backward) pairs over four routings, outputs poisoned each call."""
  rng = np.random.default_rng(23)
  sets, _, _, _ = _sets(rng, 4, 256, 4, 16, 4, False, False)
  _run_bwd(4, 256, 4, 16, sets, cap=_sm_count() // 4, calls=100, input_gating=False)
