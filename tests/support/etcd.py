"""etcd for the tests: members and clusters on free loopback ports with throwaway data folders,
clients, and the launcher flags of an etcd job. Without the `etcd` binary (Debian: etcd-server)
the tests that need one are skipped (`needs_etcd`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from support import system
from support.ports import free_port

ETCD = system.which("etcd")
needs_etcd = pytest.mark.skipif(ETCD is None, reason=system.missing("etcd", "etcd-server"))


class Member:
    """One etcd member on loopback, its data in `folder`; started, killed and restarted by the tests."""

    def __init__(
        self, folder: Path, name: str = "m0", tls: dict | None = None, fast: bool = True, extra: tuple[str, ...] = ()
    ):
        self.folder, self.name, self.tls, self.extra = folder, name, tls or {}, extra  # extra: etcd flags of a caller's
        self.client_port, self.peer_port = free_port(), free_port()
        self.cluster = f"{name}=http://127.0.0.1:{self.peer_port}"
        self.fast = fast  # a single member may elect itself quickly; a cluster keeps etcd's timings
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> Member:
        scheme = "https" if self.tls else "http"
        url = f"{scheme}://{self.endpoint}"
        cmd = [
            ETCD,
            "--name",
            self.name,
            "--data-dir",
            str(self.folder / self.name),
            "--listen-client-urls",
            url,
            "--advertise-client-urls",
            url,
            "--listen-peer-urls",
            f"http://127.0.0.1:{self.peer_port}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{self.peer_port}",
            "--initial-cluster",
            self.cluster,
            "--initial-cluster-token",
            self.folder.name,
            "--log-level",
            "warn",
            "--logger",
            "zap",
        ]
        if self.fast:
            cmd += ["--heartbeat-interval", "50", "--election-timeout", "500"]
        if self.tls:
            cmd += [
                "--cert-file",
                self.tls["server.crt"],
                "--key-file",
                self.tls["server.key"],
                "--trusted-ca-file",
                self.tls["ca.crt"],
                "--client-cert-auth",
            ]
        cmd += self.extra
        log = open(self.folder / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        log.close()
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until /health says the member has a leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc and self.proc.poll() is None, (self.folder / f"{self.name}.log").read_text()[-2000:]
            try:
                if json.loads(self._get("/health")).get("health") == "true":
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise AssertionError(f"etcd {self.name} not healthy within {timeout} s")

    def _get(self, path: str) -> bytes:
        import ssl

        context = None
        if self.tls:
            context = ssl.create_default_context(cafile=self.tls["ca.crt"])
            context.load_cert_chain(self.tls["client.crt"], self.tls["client.key"])
        scheme = "https" if self.tls else "http"
        with urllib.request.urlopen(f"{scheme}://{self.endpoint}{path}", timeout=1, context=context) as r:
            return r.read()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()


def start_cluster(folder: Path, n: int) -> list[Member]:
    """`n` members of one cluster in `folder`, once each has a leader."""
    members = [Member(folder, f"m{i}", fast=False) for i in range(n)]
    initial = ",".join(m.cluster for m in members)
    for m in members:
        m.cluster = initial
    for m in members:
        m.start()
    for m in members:
        m.wait_ready()
    return members


def client(member: Member, **kw):
    """A pyetcd client of `member` (with its TLS files, if any)."""
    import pyetcd

    if member.tls:
        t = member.tls
        kw = dict(ca_cert=t["ca.crt"], cert_cert=t["client.crt"], cert_key=t["client.key"], **kw)
    return pyetcd.client("127.0.0.1", member.client_port, timeout=5, **kw)


def keys_of(member: Member, run_id: str, **kw) -> list[bytes]:
    """The keys the launcher keeps in etcd for `run_id`."""
    c = client(member, **kw)
    try:
        return [meta.key for _, meta in c.get_prefix(f"/launcher/{run_id}/")]
    finally:
        c.close()


def job_flags(
    endpoints: str, nnodes: str, *extra: str, nproc: int = 1, run_id: str = "job", conf: str = ""
) -> list[str]:
    """Launcher flags for an etcd job on ENDPOINTS, with a 1 s last call unless `conf` says otherwise."""
    conf = ",".join(filter(None, ["last_call_timeout=1", conf]))
    return [
        "--nnodes",
        nnodes,
        "--nproc_per_node",
        str(nproc),
        "--rdzv_backend",
        "etcd",
        "--rdzv_endpoint",
        endpoints,
        "--rdzv_id",
        run_id,
        "--rdzv_conf",
        conf,
        *extra,
    ]


class Members:
    """Starts members on demand (`make`); `close` stops every one and removes their data."""

    def __init__(self, mktemp) -> None:
        self.mktemp = mktemp  # tmp_path_factory.mktemp
        self.started: list[Member] = []
        self.folders: list[Path] = []

    def make(self, n: int = 1, tls: dict | None = None) -> list[Member]:
        """One member (with `tls`: serving HTTPS with client certificates) or a cluster of `n`."""
        folder = self.mktemp("etcd")
        self.folders.append(folder)
        members = start_cluster(folder, n) if n > 1 else [Member(folder, tls=tls).start()]
        self.started.extend(members)
        if n == 1:
            members[0].wait_ready()
        return members

    def close(self) -> None:
        for m in self.started:
            m.stop()
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)
