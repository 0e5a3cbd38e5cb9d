"""Chooses, per op call, between the fused FFI kernel and the pure-JAX reference twin.

`KOSMOS_IMPL=auto|reference|fused` sets the default; every op also takes `impl=`
to override it for one call, so a fused op can be checked against its twin in one
program. A fused kernel is known to this module only once it is registered here
by the code that wraps its FFI target; until then `fused` raises.

`auto` picks a fused kernel only if it was registered with `auto=True`, or with an
`auto` rule that holds for the call (the MoE ops: the shapes and GPU they were measured
faster on): a kernel that is correct but not yet faster than XLA's own collective +
dot (the reference path) must be asked for explicitly, so `auto` never makes a
program slower where it was measured.

The fused FFI primitives have no differentiation rules of their own: `run_fused`
gives a fused call the derivatives of its reference twin at the same point (forward
and reverse mode), so `jax.grad` and `jax.jvp` behave as on the twin.
"""
from __future__ import annotations

import os
from typing import Callable

import jax

from kosmos_jax import _ext

IMPLS = ("auto", "reference", "fused")

# op name -> callable with the op's signature that issues the fused FFI call.
_FUSED: dict[str, Callable] = {}
# ops whose fused kernel `auto` runs (measured faster than XLA): True, wherever it can
# run; or a rule, rule(*args, **kwargs) -> '' (run it) or why the twin stays, called
# with the op's arrays and its static keyword arguments (precision included).
_AUTO: dict[str, bool | Callable[..., str]] = {}


def register_fused(op: str, fn: Callable, *, auto: bool | Callable[..., str] = False) -> None:
  """Register `op`'s fused kernel; `auto=True` (or a rule, see _AUTO) once benchmarks
  show it beats XLA (there)."""
  _FUSED[op] = fn
  if auto:
    _AUTO[op] = auto
  else:
    _AUTO.pop(op, None)


def check_impl(impl, *, source: str = "impl") -> None:
  """One rule for every spelling of the path choice (argument, env var, module
  constructor): exactly one of IMPLS, lower case; `source` names where it came from."""
  if impl not in IMPLS:
    raise ValueError(f"{source}={impl!r} must be one of {IMPLS}")


def default_impl() -> str:
  impl = os.environ.get("KOSMOS_IMPL", "") or "auto"  # set but empty counts as unset
  check_impl(impl, source="KOSMOS_IMPL")
  return impl


def fused_status(op: str):
  """(True, '') when `op` can run fused here, else (False, why not)."""
  if op not in _FUSED:
    return False, f"no fused kernel for {op!r} is implemented yet (only the reference twin exists)"
  state = _ext.available()
  if not state:
    return False, state.reason
  return True, ""


def _auto_reason(op: str, call: tuple | None) -> str:
  """Why `auto` keeps `op`'s twin though its kernel can run ('' where it runs fused);
  `call` = (args, kwargs) of the op's call, which a rule needs (without: its rule is
  taken to hold, the answer for "can auto run it here at all")."""
  rule = _AUTO.get(op)
  if not rule:
    return (f"the fused {op!r} kernel runs here but is not yet faster than XLA, so auto keeps "
            "the reference; impl='fused' or KOSMOS_IMPL=fused selects it")
  if rule is True or call is None:
    return ""
  args, kwargs = call
  return rule(*args, **kwargs)


def choose(op: str, impl: str | None, call: tuple | None = None) -> str:
  """Resolve `impl` (None = KOSMOS_IMPL) to 'reference' or 'fused' for `op`; `call`
  = (args, kwargs) of the op's call, for `auto` rules (see _AUTO)."""
  impl = default_impl() if impl is None else impl
  check_impl(impl)
  if impl == "reference":
    return "reference"
  ok, why = fused_status(op)
  if impl == "fused" and not ok:
    raise NotImplementedError(
        f"kosmos op {op!r} was asked to run fused (impl='fused' or KOSMOS_IMPL=fused), "
        f"but it cannot: {why}. Use impl='reference' or KOSMOS_IMPL=auto.")
  if impl == "auto" and ok and _auto_reason(op, call):
    return "reference"
  return "fused" if ok else "reference"


def auto_note(op: str, call: tuple | None = None) -> str:
  """Why `auto` runs the reference twin for `op` here ('' when it runs fused);
  `call` as for choose."""
  ok, why = fused_status(op)
  return _auto_reason(op, call) if ok else why


def fused(op: str) -> Callable:
  return _FUSED[op]


def run_fused(op: str, twin: Callable, args: tuple, kwargs: dict):
  """`op`'s fused kernel on `args` (arrays) with `kwargs` (static), differentiable
  as `twin(*args)`, the reference twin with its static arguments bound.

  The tangent is the twin's JVP, linear in the tangents and made of JAX ops (dots,
  collectives), so JAX also transposes it for reverse mode. Under jit the twin's
  own primal output in that JVP is unused and dropped: a gradient costs the twin's
  backward, while the forward value is the fused kernel's.
  """
  kernel = _FUSED[op]

  @jax.custom_jvp
  def f(*a):
    return kernel(*a, **kwargs)

  @f.defjvp
  def _jvp(primals, tangents):
    _, tangent = jax.jvp(twin, primals, tangents)
    return f(*primals), tangent

  return f(*args)
