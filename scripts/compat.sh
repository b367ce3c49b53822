#!/usr/bin/env bash
# The worker-side checks against other torch releases: scripts/compat.sh VERSION… (e.g. 2.4.1 2.15.0).
#
# For each version, one at a time: a fresh venv under ${COMPAT_DIR:-/tmp}, torch==VERSION and the
# launcher's own dependencies (the launcher itself runs from this checkout, on PYTHONPATH), then
# scripts/compat/checks.py in it (torchrun parity, DDP on gloo with and without --preload, every
# TCPStore op, three c10d agents and a restart, a store hosted by torch), then the venv is deleted:
# a CUDA build is ~5 GB. Pip's cache is left alone (--no-cache-dir) for the same reason.
# Rows of the matrix (scripts/bench/RESULTS.md) are printed at the end; exit 1 if any check failed.
#
# A machine-wide pip constraint (e.g. torch<=2.14.1) is lifted for these venvs only: PIP_CONSTRAINT
# points at an empty file. COMPAT_KEEP=1 keeps each venv, COMPAT_ONLY=name,name runs some checks.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: scripts/compat.sh VERSION… (e.g. scripts/compat.sh 2.4.1 2.15.0)" >&2; exit 2; }
PY=${PYTHON:-python3}
base=${COMPAT_DIR:-/tmp}
empty=$(mktemp)
lines=$(mktemp)
trap 'rm -f "$empty" "$lines"' EXIT
rows=()
status=0
for v in "$@"; do
    if ! [[ $v =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]]; then
        echo "compat: $v is not a torch version (e.g. 2.15.0)" >&2
        exit 2
    fi
    venv="$base/launcher-compat-$v"
    rm -rf "$venv"
    echo "== torch $v: installing into $venv" >&2
    t0=$SECONDS
    # (pip's notes about this machine's local index folders are left out)
    if ! "$PY" -m venv "$venv" \
        || ! PIP_CONSTRAINT="$empty" "$venv/bin/pip" install -q --no-cache-dir --disable-pip-version-check \
            "torch==$v" numpy "click>=8.1" "psutil>=5.9" "rich>=13" "python-hostlist>=1.23" "h11>=0.14" \
            2> >(grep -v "^WARNING: Location" >&2); then
        rows+=("| $v | install failed | | | | | |")
        status=1
        rm -rf "$venv"
        continue
    fi
    echo "== torch $v: installed in $((SECONDS - t0)) s ($(du -sh "$venv" | cut -f1)); checking" >&2
    # checks.py's lines go to stderr as they come (through tee's own stdout: reopening /dev/stderr
    # would truncate or interleave a redirected log), and to a file for the row
    "$venv/bin/python" scripts/compat/checks.py ${COMPAT_ONLY:+--only "$COMPAT_ONLY"} | tee "$lines" >&2 || status=1
    rows+=("$(tail -n1 "$lines")")
    [ "${COMPAT_KEEP:-0}" = 1 ] || rm -rf "$venv"
done
echo
echo "| torch | env parity | DDP gloo | DDP gloo --preload | store ops | 3 c10d agents + restart | torch hosts the rendezvous store | in place exact |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit $status
