"""One process of the timeout-report test: process 0 calls the fused AG+GEMM
(Hopper builders, bf16) while process 1 never does, so process 0's waits for
process 1's rows must time out, report what they waited for on stderr (through
the host-memory mailbox: these kernels may not printf) and fail the call
instead of hanging. Usage: python mp_timeout_worker.py PROCESS_ID NUM_PROCESSES PORT"""
import os
import sys
import time

os.environ["KOSMOS_TIMEOUT_MS"] = "1500"
import mp_common  # noqa: E402,I001  (before jax: sets the environment)
import jax  # noqa: E402
import numpy as np  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402


def main():
  pid, mesh = mp_common.start(sys.argv)
  if pid != 0:
    time.sleep(25)  # stay in the job while process 0 times out, never calling the op
    print("MP_OK process 1", flush=True)
    return
  from kosmos_jax import ops
  from kosmos_jax.testing import builder_runs

  x = np.ones((2, 256, 128), jnp.bfloat16)
  w = np.ones((128, 256), jnp.bfloat16)
  f = jax.jit(jax.shard_map(lambda a, b: ops.ag_tn(a, b, axis_name="tp", impl="fused"), mesh=mesh,
                            in_specs=(P(None, "tp", None), P()), out_specs=P("tp", None, None)))
  try:
    y = f(mp_common.glob(mesh, x, P(None, "tp", None)), mp_common.glob(mesh, w, P()))
    np.asarray(y.addressable_shards[0].data)
  except Exception as e:  # the trapped launch surfaces as an XLA runtime error
    time.sleep(0.5)  # the mailbox printer polls every 20 ms
    print(f"MP_TIMEOUT_RAISED {type(e).__name__} sm90_runs={builder_runs()['ag_tn']['sm90']}", flush=True)
    os._exit(0)  # the CUDA context is unusable after a trap; skip the orderly shutdown
  print("MP_NO_ERROR: the call returned although process 1 never ran it", flush=True)


if __name__ == "__main__":
  main()
