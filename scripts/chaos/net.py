"""The episode's hosts as root: a hub network namespace with a bridge, and one namespace per node on a veth into it."""

from __future__ import annotations

import os
import re
import shutil

from .proc import sh
from .records import NODES

IS_ROOT = os.geteuid() == 0
SUBNET = "10.117.0"  # the episode's hosts; these addresses exist only inside its namespaces


class Net:
    """The episode's hosts: namespace `hub` holds a bridge at SUBNET.1 (the store or etcd runs there);
    node i's namespace holds eth0 at SUBNET.(11+i), a veth whose other end, p<i>, is a port of the bridge.
    No interface or address is made outside these namespaces; close() deletes them, and with them
    every veth and the bridge."""

    def __init__(self, tag: str, nodes: int = NODES):
        self.hub, self.nodes = f"{tag}-hub", [f"{tag}-n{i}" for i in range(nodes)]
        self.made: list[str] = []
        try:
            for ns in (self.hub, *self.nodes):
                self._ip("netns", "add", ns)
                self.made.append(ns)
                self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            self._ip("-n", self.hub, "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
            self._ip("-n", self.hub, "link", "set", "br0", "up")
            for i, ns in enumerate(self.nodes):
                self._ip("-n", self.hub, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                self._ip("-n", self.hub, "link", "set", f"p{i}", "master", "br0", "up")
                self._ip("-n", ns, "addr", "add", f"{SUBNET}.{11 + i}/24", "dev", "eth0")
                self._ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _ip(*args: str) -> None:
        r = sh("ip", *args)
        if r.returncode:
            raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def link(self, node: int, at: str, state: str) -> None:
        """Set node's link `state` ("down" or "up") at the node's end ("node") or the bridge's ("hub")."""
        ns, dev = (self.nodes[node], "eth0") if at == "node" else (self.hub, f"p{node}")
        sh("ip", "-n", ns, "link", "set", dev, state)  # after close(): the namespace is gone, nothing to do

    def close(self) -> None:
        """Delete the namespaces it made, and with them their links."""
        for ns in reversed(self.made):
            sh("ip", "netns", "del", ns)
        self.made.clear()


def netns_usable() -> bool:
    """Root, iproute2, and a namespace can be made here."""
    if not IS_ROOT or shutil.which("ip") is None:
        return False
    probe = f"chaos{os.getpid()}-probe"
    ok = sh("ip", "netns", "add", probe).returncode == 0
    sh("ip", "netns", "del", probe)
    return ok


def sweep_namespaces() -> None:
    """Delete the namespaces of campaigns that died without deleting theirs (their pid in the name is gone)."""
    for line in sh("ip", "netns", "list").stdout.splitlines():
        m = re.match(r"(chaos(\d+)-\S+)", line)
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            sh("ip", "netns", "del", m.group(1))
