"""Path selection: KOSMOS_IMPL and impl= choose reference or fused; fused without a
kernel raises NotImplementedError (never a silent fallback)."""
import jax
import pytest

from kosmos_jax import ops
from kosmos_jax.testing import fake_fused
from helpers import P, assert_close, fresh, mesh, put


def lower(impl=None, tp=2, x=None, w=None):
  m = mesh(tp)
  x = fresh((8, 4)) if x is None else x
  w = fresh((4, 6)) if w is None else w
  x, w = put(x, m, P("tp", None)), put(w, m, P(None, "tp"))
  f = jax.shard_map(lambda x, w: ops.ag_tn(x, w, axis_name="tp", impl=impl), mesh=m,
                    in_specs=(P("tp", None), P(None, "tp")), out_specs=P(None, "tp"))
  return jax.jit(f)(x, w)


def test_auto_uses_reference_without_kernels():
  assert ops.choose("ag_tn", "auto") == "reference"
  assert ops.choose("ag_tn", "reference") == "reference"


def test_fused_without_kernel_raises(monkeypatch):
  with pytest.raises(NotImplementedError, match=r"'ag_tn' was asked to run fused"):
    lower(impl="fused")
  monkeypatch.setenv("KOSMOS_IMPL", "fused")
  with pytest.raises(NotImplementedError, match="fused"):
    lower()
  with pytest.raises(NotImplementedError, match="matmul"):
    ops.matmul(fresh((4, 4)), fresh((4, 4)), layout="TN")


def test_env_values(monkeypatch):
  monkeypatch.setenv("KOSMOS_IMPL", "reference")
  assert ops.default_impl() == "reference"
  lower()
  monkeypatch.setenv("KOSMOS_IMPL", "turbo")
  with pytest.raises(ValueError, match=r"KOSMOS_IMPL='turbo' must be one of"):
    lower()


def test_per_call_override_beats_env(monkeypatch):
  monkeypatch.setenv("KOSMOS_IMPL", "fused")
  x, w = fresh((8, 4)), fresh((4, 6))
  a = lower(impl="reference", x=x, w=w)
  monkeypatch.setenv("KOSMOS_IMPL", "reference")
  assert_close(a, lower(x=x, w=w), what="override")


def test_fused_status_names_the_reason():
  ok, why = ops.fused_status("tn_rs")
  if not ok:
    assert why


def test_auto_needs_an_auto_registration():
  """A fused kernel that can run but is not registered auto=True runs only when asked."""
  with fake_fused({"toy": lambda *a: None}):
    assert ops.choose("toy", "fused") == "fused"
    assert ops.choose("toy", "auto") == "reference"
    assert "not yet faster than XLA" in ops.auto_note("toy")
  with fake_fused({"toy": lambda *a: None}, auto=True):
    assert ops.choose("toy", "auto") == "fused"
    assert ops.auto_note("toy") == ""
  # The stand-ins are gone again.
  assert "no fused kernel for 'toy'" in ops.fused_status("toy")[1]


def test_one_spelling_rule_for_impl(monkeypatch):
  """Issue 24.6: impl='Reference' was rejected while KOSMOS_IMPL=Reference was accepted."""
  for bad in ("Reference", " reference", "FUSED"):
    with pytest.raises(ValueError, match=rf"impl={bad!r} must be one of"):
      ops.choose("ag_tn", bad)
    monkeypatch.setenv("KOSMOS_IMPL", bad)
    with pytest.raises(ValueError, match=rf"KOSMOS_IMPL={bad!r} must be one of"):
      ops.default_impl()
  monkeypatch.setenv("KOSMOS_IMPL", "")
  assert ops.default_impl() == "auto"  # set but empty: as if unset
