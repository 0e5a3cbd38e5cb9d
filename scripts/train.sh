#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the main job: examples/train.py (args passed on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
python examples/train.py "$@"
