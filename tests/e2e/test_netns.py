"""Nodes as separate network hosts: two network namespaces joined by a veth pair (root only)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import system
from support.netns import network_hosts
from support.paths import ROOT, worker

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not system.which("ip"),
    reason=system.SKIPPED if system.NO_SYSTEM else "needs root and iproute2 to create network namespaces",
)


@pytest.fixture
def two_hosts():
    """Hosts a (10.77.0.1) and b (10.77.0.2): private addresses that exist only in these namespaces."""
    with network_hosts("10.77.0") as (a, b, _):
        yield a, b


def test_c10d_across_two_network_hosts(launch, two_hosts):
    a, b = two_hosts
    args = [
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "10.77.0.1:29400",
        "--rdzv_id",
        "netns",
        worker("ddp_seed.py"),
    ]
    env = launch.env({"PYTHONPATH": str(ROOT)})
    procs = [
        subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "launcher", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for ns in (a, b)
    ]
    launch.procs.extend(procs)
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-3000:] for _, e in outs)
    # Group ranks follow the order of joining, not which host holds the store: either host may be rank 0.
    lines = sorted(line for out, _ in outs for line in out.splitlines() if " ok rank=" in line)
    assert len(lines) == 2 and "ok rank=0 world=2 sum=1" in lines[0] and "ok rank=1 world=2 sum=1" in lines[1], outs
    assert all(" ok rank=" in out for out, _ in outs), outs  # one worker on each host
