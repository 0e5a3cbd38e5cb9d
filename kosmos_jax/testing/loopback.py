"""The loopback hook (csrc/loopback.h) for tests and benchmarks: one fused call's
`tp` ranks as `tp` concurrent launches on one GPU, each rank with its own heap,
stream, inputs and output, through the FFI handlers' own launch path. It checks
the device protocol where peer GPUs are not at hand; its timings contain no
NVLink (a "peer" heap is this GPU's memory). Not a user API."""
from __future__ import annotations

import numpy as np

from kosmos_jax import _ext, runtime
from kosmos_jax.kernel_config import RS_TRANSPORTS


def _module():
  mod, why = _ext._module()
  if mod is None or not hasattr(mod, "loopback_run"):
    raise NotImplementedError(f"loopback needs the CUDA extension: {why or 'built without CUDA'}")
  return mod


def run(ops, tp, rows, k, n, inputs, *, cu_cap, calls, transports=("pull",), knob=-1, switching=True,
        stage_bf16=False, band_rows=1, heap_mb=256, check=True, ordinal=0, m_local=0, moe=None):
  """Runs `calls` calls; call i runs ops[i % len(ops)] on input set
  (i // len(ops)) % len(inputs) with transport transports[i % len(transports)].

  transports: names of kernel_config.RS_TRANSPORTS ("pull", "push", "push_fold"),
  as the fused ops' `transport` attribute carries them; an op refuses one it lacks
  (ag_tn has no push_fold, ag_nn only pulls), while the bulk ops run their single
  transport whatever the name.

  inputs[s][r]: the bf16 numpy arrays of rank r in set s, in the order and shapes
  csrc/loopback.h's table gives per op (e.g. ag_tn: x [rows, k], w [k, n]; an
  input may be longer than an op reads, so ops of one run can share a set).
  Returns (first, mismatches, seconds): first[c][r] the bytes of rank r's outputs
  of call c < len(inputs) * len(ops) (the first of its (set, op) pair; an op's
  outputs one after the other), mismatches[i] the 16-bit words of call i that
  differ from the first call of its pair; with check=False (timing) outputs are
  neither poisoned nor kept and both lists are empty. m_local (AG ops): rows per
  batch of a rank's shard (0: one batch); the gathered rows are then laid out
  batch-major, as all_gather_rows over a leading batch dim does.

  moe (ops "moe_forward" and "moe_backward", tp = the EP group's ranks, rows = tokens
  per rank, k = hidden): (num_experts, top_k, expert_intermediate, input_gating); knob
  is then the movers (-1: the kernel's rule). A moe_backward must follow a moe_forward
  in `ops` (it reads the workspace that forward left on each rank).
  """
  names = _names(transports)
  runtime.init()  # prepares the kernels on every local device
  ins = [[[np.ascontiguousarray(a).tobytes() for a in rank] for rank in s] for s in inputs]
  return _module().loopback_run(
      ordinal, list(ops), tp, rows, k, n, cu_cap, knob, int(switching), int(stage_bf16), band_rows,
      names, calls, heap_mb << 20, ins, int(check), int(m_local), [int(v) for v in (moe or ())])


def _names(transports) -> list[str]:
  # Refused before nanobind's cast, naming the value: a bare string is no list of
  # names, and callers of the integer codes this took before get told the names.
  if isinstance(transports, str) or not all(isinstance(t, str) for t in transports):
    raise ValueError(f"loopback: transports={transports!r} must be a sequence of transport names "
                     f"{RS_TRANSPORTS}, e.g. ('pull',)")
  return list(transports)


def capture(ops, tp, rows, k, n, inputs, *, cu_cap, cap=4096, warmup=3, ordinal=0, **kw):
  """(records, dropped): role timelines (kosmos_jax.trace) of one loopback call,
  after `warmup` untraced calls; needs a KOSMOS_TRACE build. Each record's rank
  is the loopback rank, its cta the CTA within that rank's launch."""
  from kosmos_jax import trace
  mod = trace.traced_module()
  if not isinstance(cap, int) or cap < 1:
    raise ValueError(f"capture: cap={cap!r} must be a positive int")
  run(ops, tp, rows, k, n, inputs, cu_cap=cu_cap, calls=warmup, check=False, ordinal=ordinal, **kw)
  mod.trace_enable(ordinal, cap)
  try:
    run(ops, tp, rows, k, n, inputs, cu_cap=cu_cap, calls=1, check=False, ordinal=ordinal, **kw)
  finally:
    mod.trace_disable(ordinal)
  raw, counts, c = mod.trace_read(ordinal)
  return trace.records_from_buffer(raw, np.frombuffer(counts, np.uint32), int(c))
