#!/usr/bin/env bash
# The demo: set up (once, quietly), then train a small DDP model on 2 workers (gloo on CPU). Rank 1
# is killed halfway through epoch 3 on purpose; the launcher sees it at once, restarts the group, and
# the job resumes at the step in flight from the launcher's copy in memory (not its epoch-2
# checkpoint), saying how long that took. The workers are forked from an interpreter that imported
# torch once (--preload), so the restart does not wait for torch again.
# Every run trains afresh in a folder of its own under runs/ (extra arguments go to
# examples/train_ddp.py, e.g. --epochs 8; DEMO_LAUNCHER_ARGS to the launcher, e.g. --no-preload).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
dir="runs/demo-$(date +%Y%m%d-%H%M%S)-$$"
echo "demo: 2 workers train a small model, checkpoints in $dir/" >&2
echo "demo: rank 1 will be killed halfway through epoch 3 (rank 0's error that follows is expected);" >&2
echo "demo: the launcher restarts both, and training resumes at the step in flight (the launcher's copy in memory)" >&2
exec .venv/bin/python -m launcher --nproc_per_node 2 --max_restarts 1 --preload ${DEMO_LAUNCHER_ARGS:-} \
    examples/train_ddp.py --checkpoint-dir "$dir" --crash-at-epoch 3 --crash-rank 1 "$@"
