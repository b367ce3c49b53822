"""The episode's rendezvous store: `launcher store` for c10d, a 3-member etcd cluster for etcd."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from support.ports import free_port

from .proc import Proc, ports


class C10dStore:
    """`launcher store` on ADDR (in namespace `host`)."""

    def __init__(self, addr: str, host: str | None):
        self.addr, self.host, self.port = addr, host, free_port()
        self.endpoint = f"{addr}:{self.port}"
        self.proc = Proc(
            "store", [sys.executable, "-m", "launcher", "store", "--host", addr, "--port", str(self.port)], {}, host
        )
        deadline = time.monotonic() + 20
        while not any("serving on" in line for line in self.proc.out + self.proc.err):
            if time.monotonic() > deadline or self.proc.popen.poll() is not None:
                raise RuntimeError(f"the c10d store did not start: {self.proc.err[-5:]}")
            time.sleep(0.05)

    def close(self) -> None:
        """SIGKILL the store."""
        self.proc.kill_all()


# Run in the store's namespace: what an etcd member answers on `url` (a POST of `body` if given), or nothing.
ASK = (
    "import sys, urllib.request as u\n"
    "try: print(u.urlopen(u.Request(sys.argv[1], sys.argv[2].encode() or None), timeout=1).read().decode())\n"
    "except OSError: pass\n"
)


class EtcdCluster:
    """SIZE etcd members on ADDR's ports (in namespace `host`), bootstrapped statically, their data in
    `folder`; a member is killed and restarted on its data; close() stops them for good."""

    def __init__(self, folder: Path, addr: str, host: str | None, size: int = 3):
        self.folder, self.addr, self.host = folder, addr, host
        flat = ports(2 * size)
        self.ports = list(zip(flat[::2], flat[1::2]))  # (client, peer) of each member
        self.endpoint = ",".join(f"{addr}:{client}" for client, _ in self.ports)
        self.initial = ",".join(f"m{i}=http://{addr}:{peer}" for i, (_, peer) in enumerate(self.ports))
        self.procs: list[Proc | None] = [None] * size
        self._lock = threading.Lock()
        self._closed = False
        self.start_all()

    def start(self, i: int) -> None:
        """Start member i on its data dir (nothing once the cluster is closed)."""
        client, peer = (f"http://{self.addr}:{p}" for p in self.ports[i])
        argv = [
            shutil.which("etcd") or "etcd",
            "--name",
            f"m{i}",
            "--data-dir",
            str(self.folder / f"etcd{i}"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            self.initial,
            "--initial-cluster-token",
            self.folder.name,
            "--log-level",
            "warn",
            "--logger",
            "zap",
            # an election within about a second (etcd's defaults: 1-3 s, close to the episodes' read_timeout)
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
        ]
        with self._lock:  # a restart timer that fires after close() starts nothing
            if not self._closed:
                self.procs[i] = Proc(f"etcd{i}", argv, {}, self.host)

    def start_all(self) -> None:
        """Start every member and wait until each says it is healthy."""
        for i in range(len(self.ports)):
            self.start(i)
        deadline = time.monotonic() + 30
        while not all(self.ask(i, "/health").get("health") == "true" for i in range(len(self.ports))):
            if time.monotonic() > deadline or any(p is None or p.popen.poll() is not None for p in self.procs):
                raise RuntimeError(f"the etcd cluster did not start: {[p.err[-3:] for p in self.procs if p]}")
            time.sleep(0.1)

    def ask(self, i: int, path: str, body: str = "") -> dict:
        """Member i's JSON answer on `path` ({} when it does not answer), asked from inside its namespace."""
        argv = [sys.executable, "-c", ASK, f"http://{self.addr}:{self.ports[i][0]}{path}", body]
        r = subprocess.run(
            ["ip", "netns", "exec", self.host, *argv] if self.host else argv, capture_output=True, text=True, timeout=10
        )
        try:
            return json.loads(r.stdout or "{}")
        except ValueError:
            return {}

    def leader(self) -> int | None:
        """The member that is the leader now, by its own /v3/maintenance/status."""
        for i, p in enumerate(self.procs):
            if p is not None and p.popen.poll() is None:
                status = self.ask(i, "/v3/maintenance/status", "{}")
                if status.get("leader") and status.get("leader") == status.get("header", {}).get("member_id"):
                    return i
        return None

    def kill(self, i: int) -> None:
        """SIGKILL member i."""
        if self.procs[i] is not None:
            self.procs[i].kill_all()

    def close(self) -> None:
        """Stop every member for good."""
        with self._lock:
            self._closed = True
        for i in range(len(self.procs)):
            self.kill(i)
