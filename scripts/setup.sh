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
# The etcd tests need an etcd server (Debian: etcd-server); without it they are skipped. They start
# their own on free ports: a temporary policy-rc.d keeps the package's daemon off port 2379.
if ! command -v etcd >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    rcd=""; [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; rcd=1; }
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server; } \
        >/dev/null 2>&1 || echo "setup: could not install etcd-server; the etcd tests will be skipped" >&2
    [ -z "$rcd" ] || rm -f /usr/sbin/policy-rc.d
fi
# The Slurm tests (a two-node cluster on localhost) and the launch_hosts.sh tests (a private sshd on
# 127.0.0.1) need these Debian packages; without them those tests are skipped. A temporary
# policy-rc.d keeps the install from starting any daemon (no system sshd on port 22).
missing=""
for p in slurmctld:slurmctld slurmd:slurmd srun:slurm-client munged:munge /usr/sbin/sshd:openssh-server ssh:openssh-client; do
    command -v "${p%%:*}" >/dev/null 2>&1 || missing="$missing ${p#*:}"
done
if [ -n "$missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    rcd=""; [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; rcd=1; }
    { [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -60 2>/dev/null)" ] || apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing; } >/dev/null 2>&1 \
        || echo "setup: could not install$missing; the Slurm / launch_hosts tests will be skipped" >&2
    [ -z "$rcd" ] || rm -f /usr/sbin/policy-rc.d
fi
