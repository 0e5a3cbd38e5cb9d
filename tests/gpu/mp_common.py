"""The start every multi-process worker (mp_*_worker.py) shares: NVLS off and
poisoned outputs before JAX is imported, jax.distributed with one local GPU per
process, kosmos heaps exchanged as CUDA IPC handles through JAX's key-value store,
and global arrays built from the same host data in every process.
Import it before jax."""
import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
os.environ.setdefault("KOSMOS_POISON_OUTPUT", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402


def start(argv):
  """(process id, mesh over every process's GPU with axis 'tp') from
  `worker.py PROCESS_ID NUM_PROCESSES PORT`."""
  pid, nproc, port = int(argv[1]), int(argv[2]), argv[3]
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid,
                             local_device_ids=[pid])
  from kosmos_jax import runtime
  info = runtime.init()
  assert info["mode"] == "ipc", info
  return pid, jax.sharding.Mesh(np.array(jax.devices()), ("tp",))


def glob(mesh, a, spec):
  """The global array of host data `a` (identical in every process) with `spec`."""
  return jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec), lambda idx: a[idx])
