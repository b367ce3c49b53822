"""Shared helpers: run the real launcher as a subprocess and check nothing is left behind."""

from __future__ import annotations

import os
import queue
import re
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
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


def kill_leftovers(procs: list[subprocess.Popen], token: str, settle: float = 0.0) -> None:
    """Teardown: kill what a test started, give the rest `settle` s to go, then SIGKILL every process
    that still carries `token`."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    if settle:
        wait_gone(token, settle)
    for pid in procs_with_token(token):
        try:
            os.kill(pid, 9)
        except OSError:
            pass


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
        kill_leftovers(self.procs, self.token)


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


# ---------------------------------------------------------------------------- agents read by threads


class Agent:
    """One launcher process; its output is read by threads into lists, so a pipe never fills."""

    def __init__(self, popen: subprocess.Popen, token: str, name: str):
        self.popen, self.token, self.name = popen, token, name
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(s, l), daemon=True)
            for s, l in ((popen.stdout, self.out), (popen.stderr, self.err))
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stdout(self) -> str:
        return "\n".join(self.out)

    @property
    def stderr(self) -> str:
        return "\n".join(self.err)

    def wait_for(self, pattern: str, timeout: float = 30, stream: str = "out", count: int = 1) -> re.Match:
        """Block until `count` lines of stdout (or stderr) match `pattern`; fail with the output so far."""
        lines, rx = (self.out if stream == "out" else self.err), re.compile(pattern)
        deadline, seen = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            while seen < len(lines):
                m = rx.search(lines[seen])
                seen += 1
                if m:
                    count -= 1
                    if count == 0:
                        return m
            if self.popen.poll() is not None and seen >= len(lines):
                for t in self._readers:
                    t.join(2)
                if seen >= len(lines):
                    break
            time.sleep(0.02)
        pytest.fail(
            f"{self.name}: no line matching {pattern!r} (rc {self.popen.poll()})\n"
            f"{self.stdout[-3000:]}\n{self.stderr[-3000:]}"
        )

    def wait(self, timeout: float = 60) -> int:
        rc = self.popen.wait(timeout)
        for t in self._readers:
            t.join(5)
        return rc

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def workers(self) -> list[int]:
        """Pids of this agent's processes other than itself and its helpers (guard, zygote): its workers."""
        return [
            p for p in procs_with_token(self.token) if p != self.pid and _parent(p) == self.pid and not _is_helper(p)
        ]


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def _is_helper(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() in ("launcher-guard", "launcher-zygote")  # the agent's helpers
    except OSError:
        return False


class Cluster:
    """Starts agents (and a standalone store) each with its own TEST_TOKEN; kills what is left at teardown."""

    def __init__(self, preload: bool = False):
        self.agents: list[Agent] = []
        self.preload = preload  # PET_PRELOAD=1: workers forked from the zygote

    def start(self, *args: str, env: dict | None = None, netns: str | None = None, name: str = "") -> Agent:
        token = uuid.uuid4().hex
        full = dict(os.environ, TEST_TOKEN=token, PYTHONPATH=str(ROOT))
        full.pop("PYTEST_CURRENT_TEST", None)
        full.pop("PET_PRELOAD", None)
        if self.preload:
            full["PET_PRELOAD"] = "1"
        full.update(env or {})
        cmd = [*LAUNCHER, *args]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full)
        agent = Agent(popen, token, name or f"agent{len(self.agents)}")
        self.agents.append(agent)
        return agent

    def store(self, host: str, port: int, netns: str | None = None) -> Agent:
        """A standalone `launcher store`, once it says it is serving."""
        store = self.start("store", "--host", host, "--port", str(port), netns=netns, name="store")
        store.wait_for("serving on", timeout=30)
        return store

    def leftovers(self, timeout: float = 10.0) -> dict[str, list[int]]:
        """Processes still alive per agent name (agents themselves included), after waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        left = {}
        for a in self.agents:
            gone = wait_gone(a.token, max(0.1, deadline - time.monotonic()))
            if gone:
                left[a.name] = gone
        return left

    def cleanup(self) -> None:
        for a in self.agents:
            if os.environ.get("FAULTS_DEBUG"):  # FAULTS_DEBUG=1 pytest -s: every agent's output
                print(f"\n===== {a.name} rc={a.popen.poll()}\n{a.stdout[-4000:]}\n----- stderr\n{a.stderr[-6000:]}")
            for pid in [a.pid, *procs_with_token(a.token)]:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
            try:
                a.popen.wait(5)
            except subprocess.TimeoutExpired:
                pass


# ---------------------------------------------------------------------------- shared helpers


def free_port() -> int:
    """A loopback port free right now (the tests' own copy: no launcher module needed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def c10d(
    port: int, nnodes: str, *extra: str, nproc: int = 1, run_id: str = "job", conf: str = "", host: str = "127.0.0.1"
) -> list[str]:
    """Launcher flags for a c10d job on HOST:PORT, with a 1 s last call unless `conf` says otherwise."""
    conf = ",".join(filter(None, ["last_call_timeout=1", conf]))
    return [
        "--nnodes",
        nnodes,
        "--nproc_per_node",
        str(nproc),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"{host}:{port}",
        "--rdzv_id",
        run_id,
        "--rdzv_conf",
        conf,
        *extra,
    ]


def infos(out: str) -> list[dict]:
    """The key=value fields of every " info " line a worker printed (node_info.py and friends)."""
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in out.splitlines() if " info " in line]


def marks(mark_dir, rank: int) -> list[str]:
    """The words tests/workers/signals.py noted for `rank` in `mark_dir`."""
    try:
        return (mark_dir / str(rank)).read_text().split()
    except FileNotFoundError:
        return []


def all_have(mark_dir, word: str, ranks=(0, 1)):
    return lambda: all(word in marks(mark_dir, r) for r in ranks)


def wait_for(predicate, timeout: float = 20.0, what: str = "a condition", proc: subprocess.Popen | None = None):
    """Poll `predicate` until true; on timeout fail with `what` (and the launcher's output if it ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate(timeout=10)
            pytest.fail(f"launcher ended (rc {proc.returncode}) while waiting for {what}\n{out}\n{err}")
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def wait_line(proc: subprocess.Popen, needle: str, timeout: float = 30) -> str:
    """Until a line of the agent's stdout holds `needle`; its pipes are read by threads from then on
    (so `finish` returns everything it printed, this line included)."""
    if not hasattr(proc, "readers"):
        proc.lines, proc.out, proc.err = queue.SimpleQueue(), [], []

        def pump(pipe, into: list, lines=None) -> None:
            for line in pipe:
                into.append(line)
                if lines is not None:
                    lines.put(line)

        proc.readers = [
            threading.Thread(target=pump, args=(proc.stdout, proc.out, proc.lines), daemon=True),
            threading.Thread(target=pump, args=(proc.stderr, proc.err), daemon=True),
        ]
        for t in proc.readers:
            t.start()
    deadline, seen = time.monotonic() + timeout, ""
    while True:
        try:
            line = proc.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"never saw {needle!r} in {timeout} s: {seen}") from None
        seen += line
        if needle in line:
            return seen


def finish(procs, timeout: float = 90) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of each agent, each waited for at most `timeout` s."""
    out = []
    for p in procs:
        rc = p.wait(timeout)
        if hasattr(p, "readers"):
            for t in p.readers:
                t.join(5)
            out.append((rc, "".join(p.out), "".join(p.err)))
        else:
            out.append((rc, *p.communicate(timeout=5)))
    return out


def assert_one_story(stderrs: list[str], rank: int, error: str) -> None:
    """Every node of a job whose rank `rank` raised `error` with no restart left names that rank and its
    error as the job's root cause: the node it ran on as its own, every other node as remote, each with
    the true reason; no node blames a store that closed the connection."""
    local = [e for e in stderrs if re.search(rf"launcher: root cause: rank {rank} \(local rank \d+\)", e)]
    remote = [
        e
        for e in stderrs
        if re.search(
            rf"launcher: root cause \(remote, node \S+\): rank {rank} \(local rank \d+\) on \S+ exited with code 1", e
        )
    ]
    assert len(local) == 1 and len(remote) == len(stderrs) - 1, stderrs
    assert "reason: no restarts left (--max_restarts 0)" in local[0], local[0]
    for e in remote:
        assert re.search(
            r"reason: the job was closed: restart budget spent \(--max_restarts 0\); closed by node \S+", e
        ), e
        assert "re-forming" not in e, e
    for e in stderrs:
        assert f"error: {error}" in e and "closed the connection" not in e, e


# ---------------------------------------------------------------------------- the protocol on a real store


def _settings():
    from launcher.rendezvous.settings import RendezvousSettings

    return RendezvousSettings(join_timeout=10, last_call_timeout=0.5, read_timeout=2)


SETTINGS = _settings()


@pytest.fixture
def store_port():
    """A real TCPStore server (the one the agents host), on a free loopback port."""
    from launcher.rendezvous.c10d import serve

    server = serve("127.0.0.1", free_port())
    yield server.port
    server.close()


def client(port: int):
    from launcher.rendezvous.c10d import TCPStoreAdapter

    return TCPStoreAdapter("127.0.0.1", port, SETTINGS.read_timeout, connect_timeout=20)


def agents(port: int, n: int, lo: int, hi: int, run_id: str = "job") -> list:
    """`n` ElasticRendezvous nodes (nproc 2, --nnodes lo:hi) on the store at `port`."""
    from launcher.rendezvous.protocol import ElasticRendezvous, Node

    return [
        ElasticRendezvous(
            client(port),
            run_id,
            Node(node_id=f"n{i}", addr="127.0.0.1", nproc=2, min_nodes=lo, max_nodes=hi, max_restarts=3),
            SETTINGS,
            port_picker=lambda: 23456,
        )
        for i in range(n)
    ]


class FakeClock:
    """A monotonic clock that moves only when a test moves `now`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Relay:
    """A TCP relay on loopback in front of `target` (host, port), whose connections a test breaks.

    One thread accepts and pumps every pair of sockets. `cut(rst=False)` closes every pair now
    (with `rst`: a reset, not a FIN), `stall()` stops moving bytes on the pairs open now (a
    partition that keeps them open), `cut_next(to_server)` closes the pair through which the next
    bytes go that way instead of passing them on. New connections are relayed as before (closed at
    once while `refuse` is set).
    `close()` stops it and closes everything.
    """

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.listener, selectors.EVENT_READ, "accept")
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._other: dict[socket.socket, socket.socket] = {}  # each end -> its other end
        self._upstream: set[socket.socket] = set()  # the ends that face the target
        self._todo: queue.Queue = queue.Queue()
        self._stalled: set[socket.socket] = set()
        self._armed: bool | None = None  # cut_next: True toward the server, False toward the client
        self.refuse = False  # True: a new connection is closed at once (as if nothing were behind the relay)
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self._thread.start()

    def cut(self, rst: bool = False) -> int:
        """Close every relayed connection (both ends) now; how many there were."""
        return self._do(lambda: self._cut_all(rst))

    def stall(self) -> int:
        """Stop passing bytes on the connections open now (they stay open); how many."""
        return self._do(lambda: (self._stalled.update(self._other), len(self._other) // 2)[1])

    def cut_next(self, to_server: bool) -> None:
        """Close the connection through which bytes next go toward the server (or the client) instead."""
        self._do(lambda: setattr(self, "_armed", to_server))

    def close(self) -> None:
        self._do(lambda: self._cut_all(False))
        self._todo.put(None)
        self._wake_w.send(b"x")
        self._thread.join(5)
        for s in (self.listener, self._wake_r, self._wake_w):
            s.close()

    def _do(self, what):
        done: queue.Queue = queue.Queue()
        self._todo.put((what, done))
        self._wake_w.send(b"x")
        return done.get(timeout=10)

    def _cut_all(self, rst: bool) -> int:
        n = len(self._other) // 2
        for sock in list(self._other):
            self._drop(sock, rst)
        return n

    def _drop(self, sock: socket.socket, rst: bool = False) -> None:
        if sock not in self._other:
            return  # dropped already, with its other end
        for s in (sock, self._other[sock]):
            self._other.pop(s, None)
            self._stalled.discard(s)
            self._upstream.discard(s)
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            if rst:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()

    def _run(self) -> None:
        while True:
            for key, _ in self._sel.select():
                if key.data == "wake":
                    self._wake_r.recv(4096)
                    while not self._todo.empty():
                        job = self._todo.get()
                        if job is None:
                            return
                        what, done = job
                        done.put(what())
                elif key.data == "accept":
                    self._accept()
                elif key.fileobj in self._other:
                    self._pump(key.fileobj)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            if self.refuse:
                raise ConnectionRefusedError
            up = socket.create_connection(self.target, timeout=5)
        except OSError:
            conn.close()  # nothing behind the relay: the client sees its connection closed
            return
        self.accepted += 1
        for s in (conn, up):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(5)
        self._other[conn], self._other[up] = up, conn
        self._upstream.add(up)
        self._sel.register(conn, selectors.EVENT_READ, "pair")
        self._sel.register(up, selectors.EVENT_READ, "pair")

    def _pump(self, sock: socket.socket) -> None:
        if sock in self._stalled:
            self._sel.unregister(sock)  # left unread: the peer's bytes wait in the kernel
            return
        try:
            data = sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            return self._drop(sock)
        to_server = sock not in self._upstream
        if self._armed is to_server:
            self._armed = None
            return self._drop(sock)
        try:
            self._other[sock].sendall(data)
        except OSError:
            self._drop(sock)


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
