#!/usr/bin/env bash
# Make .venv with everything the launcher and its examples need (idempotent).
# torch is pinned first (the CPU build, 2.13.0) so pip never pulls the CUDA wheels.
# With --test, also the test extras and, when root on Debian, the system packages the tests
# drive for real: etcd, Slurm + munge, OpenSSH (a private sshd), tmux, iproute2, chromium (draws
# `launcher report`'s page headless), saying so in one line first. A test whose package is missing
# is skipped with the reason; TEST_NO_SYSTEM=1 installs none of them and skips every test that
# needs one (tests/support/system.py).
set -euo pipefail
cd "$(dirname "$0")/.."
# The interpreter: PYTHON, else python3 or a faster build of its version (scripts/pick_python.sh).
[ -x .venv/bin/python ] || "${PYTHON:-$(bash scripts/pick_python.sh)}" -m venv .venv
# The editable install only changes when the packaging does: a stamp of setup.cfg, pyproject.toml,
# this checkout's path, the install's mode and the extras lets a second run (demo.sh's) skip pip's ~5 s.
extras=$([ "${1:-}" = "--test" ] && echo '[test]' || true)
stamp=$(cat setup.cfg pyproject.toml | sha256sum | cut -d' ' -f1)" $PWD compat ."
installed=$(cat .venv/.launcher-installed 2>/dev/null || true)
# pip says nothing unless it fails: its output (warnings about the host's pip configuration
# included) is kept in a file and shown only then.
quietly() {
    local out; out=$(mktemp)
    if ! "$@" >"$out" 2>&1; then
        cat "$out" >&2; rm -f "$out"
        echo "setup: failed: $*" >&2
        exit 1
    fi
    rm -f "$out"
}
if [ "$installed" != "$stamp$extras" ] && [ "$installed" != "$stamp[test]" ]; then  # [test] covers both
    echo "setup: installing the launcher and its dependencies into .venv (once; a few minutes: torch alone is ~200 MB)" >&2
    if ! .venv/bin/python -c "import torch" 2>/dev/null; then
        quietly .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
    fi
    # A venv made before the rename (distribution `launcher`, now torch-launcher) holds the old
    # editable install: it would stay beside the new one, a second owner of the `launcher` command.
    if compgen -G ".venv/lib/python*/site-packages/launcher-*.dist-info" >/dev/null; then
        quietly .venv/bin/pip uninstall -q -y --disable-pip-version-check launcher
        rm -rf launcher.egg-info
    fi
    # compat: a .pth file that puts the checkout on sys.path. The default mode's import hook, loaded
    # from a .pth by every interpreter of .venv, cost each of them ~20 ms of start-up (pathlib, re,
    # urllib.parse): every launcher, worker and test process, ~2,000 in a run of the suite.
    quietly .venv/bin/pip install -q --disable-pip-version-check --config-settings editable_mode=compat -e ".$extras"
    # The checkout's bytecode: pip compiles no editable install, and where PYTHONDONTWRITEBYTECODE=1
    # no launcher or worker process writes it, so each would compile what it imports again (1.0 s of
    # CPU to import the agent on a busy 2-core VM, 0.25 s from bytecode). scripts/test.sh keeps it fresh.
    quietly .venv/bin/python -m compileall -q -j 0 launcher
    echo "$stamp$extras" > .venv/.launcher-installed
fi
[ "${1:-}" = "--test" ] || exit 0

if [ -n "${TEST_NO_SYSTEM:-}" ] && [ "${TEST_NO_SYSTEM}" != 0 ]; then
    echo "setup: TEST_NO_SYSTEM=1: no system packages installed; the tests that need etcd, Slurm, sshd, tmux, iproute2 or chromium are skipped" >&2
    exit 0
fi
missing=""
for p in etcd:etcd-server slurmctld:slurmctld slurmd:slurmd srun:slurm-client munged:munge \
         /usr/sbin/sshd:openssh-server ssh:openssh-client tmux:tmux ip:iproute2 chromium:chromium; do
    command -v "${p%%:*}" >/dev/null 2>&1 || missing="$missing ${p#*:}"
done
if [ -n "$missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    # The tests start their own etcd, slurmd and sshd on free ports: a temporary policy-rc.d keeps
    # the packages from starting system daemons (no etcd on 2379, no sshd on 22).
    echo "setup: installing as root (apt-get) for the tests that drive them for real:$missing (TEST_NO_SYSTEM=1 skips this and those tests)" >&2
    rcd=""; [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; rcd=1; }
    { [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -60 2>/dev/null)" ] || apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing; } >/dev/null 2>&1 \
        || echo "setup: could not install$missing; the tests that need them will be skipped" >&2
    [ -z "$rcd" ] || rm -f /usr/sbin/policy-rc.d
fi
