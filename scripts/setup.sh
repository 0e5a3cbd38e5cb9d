#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a .venv with kosmos_jax installed editable,
# its test and example extras, and the native extension built (with CUDA kernels
# when nvcc is found; KOSMOS_CUDA=auto|on|off). Re-running only rebuilds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q --upgrade pip
# Build requirements are installed into the venv and the build runs without
# isolation, so jaxlib (the FFI headers) is downloaded once, not per build.
python -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.4" "jax>=0.10.2" "nvidia-cutlass>=4.0" cmake ninja
python -m pip install -q --no-build-isolation -e ".[test,examples,hip]"
python - <<'PY'
import kosmos_jax
state = kosmos_jax.available()
print(f"kosmos_jax: fused kernels usable here: {bool(state)} ({state.reason})")
PY
