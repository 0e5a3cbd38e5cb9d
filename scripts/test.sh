#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the CPU test suite over 8 virtual devices.
# GPU tests in tests/gpu/ skip themselves without GPUs. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
# The extension was just built: a load failure must fail the suite, not skip it.
export KOSMOS_REQUIRE_EXT=${KOSMOS_REQUIRE_EXT:-1}
python -m pytest -q tests "$@"
