"""Shared helpers: run the real launcher as a subprocess and check nothing is left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"
LAUNCHER = [sys.executable, "-m", "launcher"]


def worker(name: str) -> str:
    """Path of a tiny worker script in tests/workers/."""
    return str(WORKERS / name)


def procs_with_token(token: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environment carries TEST_TOKEN=token."""
    marker = f"\0TEST_TOKEN={token}\0".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = b"\0" + f.read() + b"\0"
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in env and state != "Z":
            found.append(int(name))
    return found


def wait_gone(token: str, timeout: float = 5.0) -> list[int]:
    """Wait until no process carries `token`; return the survivors (empty is good)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = procs_with_token(token)
        if not left:
            return []
        time.sleep(0.05)
    return procs_with_token(token)


class Launch:
    """Runs `python -m launcher ARGS` with a unique TEST_TOKEN and kills leftovers at teardown.

    `preload`: the workers are forked from a preloaded zygote (PET_PRELOAD=1), not spawned.
    """

    def __init__(self, preload: bool = False):
        self.token = uuid.uuid4().hex
        self.preload = preload
        self.procs: list[subprocess.Popen] = []

    def env(self, extra: dict | None = None) -> dict:
        env = dict(os.environ, TEST_TOKEN=self.token, PYTHONPATH=str(ROOT))
        env.pop("PYTEST_CURRENT_TEST", None)
        env.pop("PET_PRELOAD", None)
        if self.preload:
            env["PET_PRELOAD"] = "1"
        env.update(extra or {})
        return env

    def run(self, *args: str, timeout: float = 60, env: dict | None = None, cwd: str | None = None):
        """Run to completion; returns CompletedProcess with text stdout/stderr."""
        return subprocess.run(
            [*LAUNCHER, *args], capture_output=True, text=True, timeout=timeout, env=self.env(env), cwd=cwd
        )

    def start(self, *args: str, env: dict | None = None, **kw) -> subprocess.Popen:
        """Start in the background (stdout/stderr piped, text)."""
        p = subprocess.Popen(
            [*LAUNCHER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env(env), **kw
        )
        self.procs.append(p)
        return p

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
        for pid in procs_with_token(self.token):
            try:
                os.kill(pid, 9)
            except OSError:
                pass


# These modules run every test that takes `launch` (or test_faults' `cluster`) twice: with spawned
# workers, and with workers forked from the --preload zygote; nothing they check may differ.
BOTH_STARTS = {"test_supervise", "test_faults", "test_examples"}


def pytest_generate_tests(metafunc):
    if metafunc.module.__name__ in BOTH_STARTS and "workers_from" in metafunc.fixturenames:
        metafunc.parametrize("workers_from", ["spawn", "preload"], indirect=True)


@pytest.fixture
def workers_from(request) -> str:
    """How the launcher starts workers: "spawn" (a fresh interpreter each) or "preload" (forked)."""
    return getattr(request, "param", "spawn")


@pytest.fixture
def launch(workers_from):
    l = Launch(preload=workers_from == "preload")
    yield l
    l.cleanup()


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=10)


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
        for ns in (a, b):  # deleting a namespace deletes its end of the veth pair, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
