#!/usr/bin/env bash
# Set up (if needed) and run the demo: DDP training, 2 workers, gloo on CPU, embedded rendezvous.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m launcher --nproc_per_node 2 examples/train_ddp.py "$@"
