"""Loads the compiled extension and registers its FFI targets, once per process.

Nothing else in the package imports `_kosmos_ext` directly: every caller asks
`loaded()` (the module imported and its targets registered) or `available()`
(additionally: CUDA kernels were compiled and a CUDA device is visible), and gets
an `Availability` that is falsy with a human-readable reason when the answer is no.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import os

import jax


@dataclasses.dataclass(frozen=True)
class Availability:
  ok: bool
  reason: str

  def __bool__(self) -> bool:
    return self.ok


@functools.cache
def _module():
  """(module, None) or (None, why it could not be imported)."""
  if os.environ.get("KOSMOS_DISABLE_EXT", "") not in ("", "0"):
    return None, "disabled by KOSMOS_DISABLE_EXT"
  try:
    return importlib.import_module("kosmos_jax._kosmos_ext"), None
  except ImportError as e:
    return None, (f"extension kosmos_jax._kosmos_ext not importable ({e}); "
                  "reinstall with `pip install -e .` to build it")


@functools.cache
def _registered() -> tuple[frozenset, str | None]:
  """Register every (target, platform) the module exports; returns what succeeded."""
  mod, why = _module()
  if mod is None:
    return frozenset(), why
  done, errors = set(), []
  for name, per_platform in mod.registrations().items():
    for platform, capsule in per_platform.items():
      try:
        jax.ffi.register_ffi_target(name, capsule, platform=platform)
        done.add((name, platform.lower()))
      except Exception as e:  # e.g. a platform this jaxlib does not know
        errors.append(f"{name}@{platform}: {e}")
  return frozenset(done), ("; ".join(errors) or None)


def loaded() -> Availability:
  """Whether the extension imported and registered its FFI targets (a build
  without CUDA kernels exports none, and is still loaded)."""
  done, why = _registered()
  if not done and why:
    return Availability(False, why)
  return Availability(True, "extension loaded" if done else "extension loaded; it exports no FFI targets")


def has_target(name: str, platform: str) -> bool:
  """Whether FFI target `name` is registered for `platform` ('cpu' or 'cuda')."""
  return (name, platform.lower()) in _registered()[0]


def available() -> Availability:
  """Whether fused CUDA kernels can run here, and if not, why not."""
  state = loaded()
  if not state:
    return state
  mod, _ = _module()
  if not mod.cuda_built():
    return Availability(False, "extension built without CUDA kernels (KOSMOS_CUDA=off or no nvcc at build time)")
  count, err = mod.cuda_device_count()
  if count < 0:
    return Availability(False, f"CUDA runtime unusable: {err}")
  if count == 0:
    return Availability(False, "no CUDA device visible")
  if not any(d.platform == "gpu" for d in jax.devices()):
    return Availability(False, f"{count} CUDA device(s) visible but JAX's default backend is {jax.default_backend()!r}")
  return Availability(True, f"CUDA kernels loaded, {count} device(s)")
