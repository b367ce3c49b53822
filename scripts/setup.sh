#!/usr/bin/env bash
# Make .venv with everything the launcher, its tests and its examples need (idempotent).
# torch is pinned first (the CPU build, 2.13.0) so pip never pulls the CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
fi
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
