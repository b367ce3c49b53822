"""Nodes as separate network hosts: two network namespaces joined by a veth pair (root only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import pytest

from conftest import ROOT, worker

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2 to create network namespaces"
)


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=10)


@pytest.fixture
def two_hosts():
    """Hosts a (10.77.0.1) and b (10.77.0.2): private addresses that exist only in these namespaces."""
    tag = uuid.uuid4().hex[:6]
    a, b = f"lna{tag}", f"lnb{tag}"
    try:
        sh("ip", "netns", "add", a)
        sh("ip", "netns", "add", b)
        sh("ip", "link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}")
        sh("ip", "link", "set", f"va{tag}", "netns", a)
        sh("ip", "link", "set", f"vb{tag}", "netns", b)
        for ns, dev, addr in ((a, f"va{tag}", "10.77.0.1/24"), (b, f"vb{tag}", "10.77.0.2/24")):
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"cannot create network namespaces here: {e}")
    try:
        yield a, b
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "pids", ns], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_c10d_across_two_network_hosts(launch, two_hosts):
    a, b = two_hosts
    args = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", "10.77.0.1:29400",
            "--rdzv_id", "netns", worker("ddp_seed.py")]
    env = launch.env({"PYTHONPATH": str(ROOT)})
    procs = [
        subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "launcher", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for ns in (a, b)
    ]
    launch.procs.extend(procs)
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-3000:] for _, e in outs)
    # Group ranks follow the order of joining, not which host holds the store: either host may be rank 0.
    lines = sorted(line for out, _ in outs for line in out.splitlines() if " ok rank=" in line)
    assert len(lines) == 2 and "ok rank=0 world=2 sum=1" in lines[0] and "ok rank=1 world=2 sum=1" in lines[1], outs
    assert all(" ok rank=" in out for out, _ in outs), outs  # one worker on each host
