"""Symmetric heap setup and device queries (DESIGN.md §4).

`init(heap_mb=None)` allocates one heap per local GPU (KOSMOS_HEAP_MB, default
1024 MiB), once per process, and maps every peer's heap:
  * one process driving all local GPUs: peer access between every pair;
  * one process per GPU (jax.distributed): CUDA IPC handles exchanged through
    JAX's distributed key-value store.
Fused ops call `init()` at trace time, so kernels never allocate. Each group
gets its own control block in the heap (`ctrl_slots`), agreed across processes.
Groups (lists of global device ids from the mesh) are checked with
`check_groups`, which refuses a group that spans hosts or lacks peer access,
naming the devices.
"""
from __future__ import annotations

import socket
import threading

import jax
import numpy as np

from kosmos_jax import _ext
from kosmos_jax import kernel_config as _config

_lock = threading.Lock()
_state: dict | None = None
_KV_TIMEOUT_MS = 120_000


def _module():
  state = _ext.available()
  if not state:
    raise NotImplementedError(f"kosmos runtime needs the CUDA extension and a GPU: {state.reason}")
  mod, _ = _ext._module()
  return mod


def _local_gpus():
  return [d for d in jax.local_devices() if d.platform == "gpu"]


def init(heap_mb: int | None = None) -> dict:
  """Allocates and maps the symmetric heaps (idempotent); returns a summary."""
  global _state
  with _lock:
    mb = _config.heap_mb_from_env() if heap_mb is None else int(heap_mb)
    if _state is not None:
      if heap_mb is not None and mb != _state["heap_mb"]:
        raise ValueError(f"kosmos runtime already initialised with heap_mb={_state['heap_mb']}; "
                         f"cannot re-initialise with heap_mb={mb}")
      return dict(_state)
    mod = _module()
    local = _local_gpus()
    mod.heap_init([d.local_hardware_id for d in local], [d.id for d in local], mb << 20)
    remote_hosts = _exchange_ipc(mod, local) if jax.process_count() > 1 else {}
    _state = dict(heap_mb=mb, local=[d.id for d in local], processes=jax.process_count(),
                  mode="ipc" if jax.process_count() > 1 else "peer", remote_hosts=remote_hosts)
    return dict(_state)


def _kv_client():
  from jax._src import distributed  # the only handle on JAX's key-value store
  client = distributed.global_state.client
  if client is None:
    raise RuntimeError("kosmos runtime: jax.process_count() > 1 but jax.distributed is not initialised")
  return client


def _exchange_ipc(mod, local) -> dict:
  """Publishes our heaps' IPC handles, opens every same-host peer's; returns
  {device id: host} for devices on other hosts (never mapped)."""
  client, host = _kv_client(), socket.gethostname()
  for d in local:
    client.key_value_set(f"kosmos/heap/{d.id}", f"{host}|{mod.ipc_handle(d.local_hardware_id).hex()}")
  me = jax.process_index()
  remote = {}
  for d in jax.devices():
    if d.process_index == me or d.platform != "gpu":
      continue
    their_host, handle = client.blocking_key_value_get(f"kosmos/heap/{d.id}", _KV_TIMEOUT_MS).split("|")
    if their_host != host:
      remote[d.id] = their_host
      continue
    mod.ipc_open(d.id, bytes.fromhex(handle), local[0].local_hardware_id)
  return remote


CTRL_SLOTS = 32  # kernels/tp/ag_layout.h kCtrlSlots


class LocalStore:
  """Set-if-absent string store for one process (the single-process mode)."""

  def __init__(self):
    self._lock = threading.Lock()
    self._data: dict[str, str] = {}

  def claim(self, key: str, value: str) -> str:
    """Stores `value` under `key` unless a value is there; returns the stored one."""
    with self._lock:
      return self._data.setdefault(key, value)


class KvStore:
  """The same contract over JAX's distributed key-value store (one process per
  GPU): key_value_set without overwrite fails for all but the first writer."""

  def __init__(self, client):
    self._client = client

  def claim(self, key: str, value: str) -> str:
    try:
      self._client.key_value_set(key, value)
      return value
    except Exception:  # noqa: BLE001 -- already set by another process: read theirs
      return self._client.blocking_key_value_get(key, _KV_TIMEOUT_MS)


class CtrlSlots:
  """Group (ordered tuple of global device ids) -> control-block slot in every
  member's heap (kernels/tp/ag_layout.h). Each group gets its own epochs and
  queues, so calls over different groups never disturb each other's counters.

  A slot is owned by the first group to claim key `kosmos/ctrl_slot/<n>`, lowest
  n first, in a store shared by every process; so all members agree on a group's
  slot whatever order each process meets its groups in."""

  def __init__(self, store, n_slots: int = CTRL_SLOTS):
    self._store, self._n = store, n_slots
    self._lock = threading.Lock()
    self._mine: dict[tuple[int, ...], int] = {}

  def slot(self, group) -> int:
    key = tuple(int(g) for g in group)
    with self._lock:
      if key in self._mine:
        return self._mine[key]
      name = ",".join(map(str, key))
      for n in range(self._n):
        if self._store.claim(f"kosmos/ctrl_slot/{n}", name) == name:
          self._mine[key] = n
          return n
    raise RuntimeError(f"kosmos runtime: group {list(key)} finds all {self._n} control slots taken by other "
                       "groups; fused ops support at most that many distinct device groups per job")

  def slots(self, groups: np.ndarray) -> np.ndarray:
    """One slot per row of `groups` (as passed to the kernels)."""
    return np.array([self.slot(row) for row in np.asarray(groups)], np.int64)


_slots: CtrlSlots | None = None


def ctrl_slots(groups: np.ndarray) -> np.ndarray:
  """Control slots of these groups, agreed with every process of the job."""
  global _slots
  init()
  with _lock:
    if _slots is None:
      _slots = CtrlSlots(KvStore(_kv_client()) if jax.process_count() > 1 else LocalStore())
  return _slots.slots(groups)


def groups_from_mesh(mesh, axis_name) -> np.ndarray:
  """[n_groups, group size] global device ids along `axis_name` (a name or a tuple
  of names, in all_gather's order), one row per group."""
  names = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
  missing = [n for n in names if n not in mesh.axis_names]
  if missing:
    raise ValueError(f"axis {missing} not in mesh axes {mesh.axis_names}")
  ids = np.vectorize(lambda d: d.id, otypes=[np.int64])(mesh.devices)
  order = [i for i, n in enumerate(mesh.axis_names) if n not in names] + [mesh.axis_names.index(n) for n in names]
  size = int(np.prod([mesh.shape[n] for n in names]))
  return np.transpose(ids, order).reshape(-1, size)


def check_groups(op: str, groups: np.ndarray) -> None:
  """Raises ValueError naming the devices if a group holding a local device has a
  member on another host or without a mapped heap."""
  st = init()
  mod = _module()
  local = {d.id: d for d in _local_gpus()}
  for row in groups:
    mine = [int(g) for g in row if int(g) in local]
    if not mine:
      continue
    src = local[mine[0]].local_hardware_id
    for g in map(int, row):
      if g in st["remote_hosts"]:
        raise ValueError(f"{op}: group {row.tolist()} spans hosts (device {g} is on {st['remote_hosts'][g]!r}, "
                         f"device {mine[0]} on {socket.gethostname()!r}); fused kernels need one host. "
                         "Use impl='reference'.")
      why = mod.unreachable(src, g)
      if why:
        raise ValueError(f"{op}: group {row.tolist()} cannot run fused from device {mine[0]}: {why}. "
                         "Use impl='reference'.")
