"""Hosts of their own: two network namespaces joined by a veth pair (root only)."""

from __future__ import annotations

import subprocess
import uuid
from contextlib import contextmanager

import pytest

from support.processes import sh


@contextmanager
def network_hosts(subnet: str):
    """Two hosts of their own: network namespaces a (SUBNET.1) and b (SUBNET.2) joined by a veth
    pair, addresses that exist nowhere else. Yields (a, b, b's link), so a test can cut b off with
    `ip -n b link set LINK down`. Root only: skips the test where namespaces cannot be made."""
    tag = uuid.uuid4().hex[:6]
    a, b, va, vb = f"lna{tag}", f"lnb{tag}", f"va{tag}", f"vb{tag}"
    try:
        sh("ip", "netns", "add", a)
        sh("ip", "netns", "add", b)
        sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        sh("ip", "link", "set", va, "netns", a)
        sh("ip", "link", "set", vb, "netns", b)
        for ns, dev, addr in ((a, va, f"{subnet}.1/24"), (b, vb, f"{subnet}.2/24")):
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as e:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {e}")
    try:
        yield a, b, vb
    finally:
        # deleting a namespace deletes its end of the veth pair, and so the pair
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
