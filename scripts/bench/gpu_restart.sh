#!/usr/bin/env bash
# A worker SIGKILLed on NCCL -> training again: torchrun, the launcher, the launcher with --preload,
# side by side (tools alternate within each repetition). One rank per GPU; examples/train_ddp.py's own
# "training again N s after rank R was killed" line is the figure (docs/gpu.md has a run on an H100).
#
#   scripts/bench/gpu_restart.sh [REPS]      (PYTHON: the interpreter with CUDA torch; NPROC: ranks)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
NPROC=${NPROC:-1}
REPS=${1:-2}
TORCHRUN=$(dirname "$(command -v "$PY")")/torchrun
[ -x "$TORCHRUN" ] || TORCHRUN=torchrun
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
logs=$(mktemp -d /tmp/gpu_restart.XXXXXX)
for rep in $(seq "$REPS"); do
    for tool in torchrun launcher preload; do
        case $tool in
            torchrun) cmd=("$TORCHRUN" --standalone) ;;
            launcher) cmd=("$PY" -m launcher) ;;
            preload) cmd=("$PY" -m launcher --preload) ;;
        esac
        log=$logs/$tool.$rep.log
        start=$(date +%s.%N)
        timeout 300 "${cmd[@]}" --nproc_per_node "$NPROC" --max_restarts 1 examples/train_ddp.py --epochs 3 \
            --checkpoint-dir "$logs/$tool.$rep.ckpt" --crash-at-epoch 2 --crash-rank 0 >"$log" 2>&1
        rc=$?
        end=$(date +%s.%N)
        printf '%-9s rep %s  rc %s  job %5.1f s  %s\n' "$tool" "$rep" "$rc" "$(awk "BEGIN{print $end-$start}")" \
            "$(grep -o -m1 'training again [0-9.]* s' "$log" || echo 'never trained again')"
    done
done
echo "logs in $logs"
