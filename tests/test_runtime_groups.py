"""CPU checks of the runtime's group extraction (groups of global device ids from a
mesh, as the fused lowering passes them) and of the kernel-knob validation."""
import jax
import numpy as np
import pytest

from kosmos_jax import kernel_config as config, runtime


def _mesh(shape, names):
  devs = np.array(jax.devices()[: int(np.prod(shape))])[::-1].reshape(shape)  # ids not in order
  return jax.sharding.Mesh(devs, names)


def test_groups_along_one_axis():
  m = _mesh((2, 4), ("dp", "tp"))
  ids = np.vectorize(lambda d: d.id)(m.devices)
  np.testing.assert_array_equal(runtime.groups_from_mesh(m, "tp"), ids)
  np.testing.assert_array_equal(runtime.groups_from_mesh(m, "dp"), ids.T)


def test_groups_over_axis_tuple_follow_all_gather_order():
  m = _mesh((2, 2, 2), ("a", "b", "c"))
  ids = np.vectorize(lambda d: d.id)(m.devices)
  got = runtime.groups_from_mesh(m, ("c", "a"))  # group index = c * 2 + a
  assert got.shape == (2, 4)
  for b in range(2):
    np.testing.assert_array_equal(got[b], [ids[a, b, c] for c in range(2) for a in range(2)])


def test_groups_unknown_axis():
  with pytest.raises(ValueError, match="'zz'"):
    runtime.groups_from_mesh(_mesh((2, 2), ("dp", "tp")), "zz")


@pytest.mark.parametrize("kw", [dict(cu_cap=0), dict(cu_cap=2.5), dict(movers=-1)])
def test_ag_config_rejects(kw):
  with pytest.raises(ValueError, match=next(iter(kw))):
    config.AgConfig(**kw)


def test_heap_mb_env(monkeypatch):
  monkeypatch.setenv("KOSMOS_HEAP_MB", "64")
  assert config.heap_mb_from_env() == 64
  monkeypatch.setenv("KOSMOS_HEAP_MB", "lots")
  with pytest.raises(ValueError, match="KOSMOS_HEAP_MB"):
    config.heap_mb_from_env()


def test_fused_ag_refused_on_cpu():
  from kosmos_jax.ops import choose
  with pytest.raises(NotImplementedError, match="ag_tn"):
    choose("ag_tn", "fused")


class _FakeDev:
  def __init__(self, i):
    self.id, self.local_hardware_id = i, i


class _FakeModule:
  """Peer access 0<->1 only; device 2 is local but unreachable from the others."""

  @staticmethod
  def unreachable(src, dst):
    ok = {(0, 1), (1, 0)} | {(i, i) for i in range(4)}
    return "" if (src, dst) in ok else f"no peer access from GPU {src} to GPU {dst}"


def _fake_runtime(monkeypatch, remote_hosts):
  monkeypatch.setattr(runtime, "init", lambda heap_mb=None: {"remote_hosts": remote_hosts})
  monkeypatch.setattr(runtime, "_module", lambda: _FakeModule)
  monkeypatch.setattr(runtime, "_local_gpus", lambda: [_FakeDev(i) for i in range(3)])


def test_group_spanning_hosts_is_refused_naming_devices(monkeypatch):
  _fake_runtime(monkeypatch, remote_hosts={8: "node-b"})
  runtime.check_groups("ag_tn", np.array([[0, 1]]))  # local, peer-connected: accepted
  with pytest.raises(ValueError, match=r"group \[0, 8\] spans hosts \(device 8 is on 'node-b', device 0 on "):
    runtime.check_groups("ag_tn", np.array([[0, 1], [0, 8]]))


def test_group_without_peer_access_is_refused_naming_devices(monkeypatch):
  _fake_runtime(monkeypatch, remote_hosts={})
  with pytest.raises(ValueError, match=r"group \[0, 2\] cannot run fused from device 0: no peer access "
                                       r"from GPU 0 to GPU 2.*impl='reference'"):
    runtime.check_groups("tn_rs", np.array([[0, 2]]))
  runtime.check_groups("tn_rs", np.array([[5, 6]]))  # no local member: not this process's business
