"""CPU checks of the control-slot assignment (kosmos_jax/runtime.py CtrlSlots):
every process of a job must give a group the same slot in every member's heap,
whatever order it meets its groups in, and distinct groups never share one."""
import os
import re
import threading

import numpy as np
import pytest

from kosmos_jax import kernel_config as config, runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_same_group_same_slot_distinct_groups_distinct_slots():
  reg = runtime.CtrlSlots(runtime.LocalStore())
  groups = [(0, 1), (2, 3), (0,), (1,), (1, 0), (0, 2)]  # rank order matters: (1, 0) != (0, 1)
  got = [reg.slot(g) for g in groups]
  assert len(set(got)) == len(groups), got
  assert [reg.slot(g) for g in reversed(groups)] == got[::-1]
  assert reg.slot(np.array([0, 1], np.int64)) == got[0]


def test_processes_agree_whatever_their_order():
  # Two processes (each its own registry) over one shared store, as over the KV store.
  store = runtime.LocalStore()
  p0, p1 = runtime.CtrlSlots(store), runtime.CtrlSlots(store)
  tp, dp, solo = (0, 1), (0, 2), (1,)
  a = {g: p0.slot(g) for g in (tp, dp, solo)}
  b = {g: p1.slot(g) for g in (solo, dp, tp)}
  assert a == b


def test_concurrent_claims_agree():
  store = runtime.LocalStore()
  groups = [(i, i + 1) for i in range(0, 16, 2)] + [(i,) for i in range(8)]
  results = []

  def process(seed):
    reg = runtime.CtrlSlots(store)
    order = np.random.default_rng(seed).permutation(len(groups))
    results.append({groups[i]: reg.slot(groups[i]) for i in order})

  threads = [threading.Thread(target=process, args=(s,)) for s in range(6)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert all(r == results[0] for r in results)
  assert sorted(results[0].values()) == list(range(len(groups)))


def test_slots_per_row_and_exhaustion():
  reg = runtime.CtrlSlots(runtime.LocalStore(), n_slots=3)
  np.testing.assert_array_equal(reg.slots(np.array([[0, 1], [2, 3]])), [0, 1])
  assert reg.slot((4,)) == 2
  with pytest.raises(RuntimeError, match=r"group \[5\].*3 control slots"):
    reg.slot((5,))


def test_python_and_device_layout_agree():
  text = open(os.path.join(ROOT, "kernels", "tp", "ag_layout.h")).read()
  assert int(re.search(r"kCtrlSlots = (\d+)", text).group(1)) == runtime.CTRL_SLOTS
  data_mib = int(re.search(r"kHeapDataOffset = (\d+)u << 20", text).group(1))
  assert config.MIN_HEAP_MB == data_mib + 1
