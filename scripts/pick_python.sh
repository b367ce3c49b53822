#!/usr/bin/env bash
# Print the interpreter scripts/setup.sh makes .venv with (PYTHON unset): python3, unless another
# python3 of the same version on this host runs without a shared libpython, as a distribution builds
# it (optimised, the library linked in). pyenv's default build loads libpython3.X.so: the suite's
# processes (launcher, zygote, worker, pytest) took ~15 % less CPU on Debian's build of the same 3.11
# (the whole suite beside two busy loops, back to back: 854 against 1,003 CPU-s). Says so in one line.
set -uo pipefail
probe='import sys, ensurepip, venv; print("%d.%d" % sys.version_info[:2], int(any("libpython" in l for l in open("/proc/self/maps"))), sys.version.split()[0])'
first=$(command -v python3) || { echo python3; exit 0; }
read -r want shared full <<<"$("$first" -c "$probe" 2>/dev/null)"
[ "${shared:-0}" = 1 ] || { echo python3; exit 0; }
for c in /usr/bin/python3 /usr/local/bin/python3; do
    [ -x "$c" ] && [ "$c" != "$first" ] || continue
    read -r v s f <<<"$("$c" -c "$probe" 2>/dev/null)"
    if [ "${v:-}" = "$want" ] && [ "${s:-}" = 0 ]; then
        echo "setup: making .venv with $c ($f, libpython linked in: ~15 % less CPU than $first's $full on a shared libpython); PYTHON= names another" >&2
        echo "$c"
        exit 0
    fi
done
echo python3
