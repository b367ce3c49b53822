"""The pure-Python TCPStore's edges: many waiters and their timeouts, a wait cancelled as its keys arrive,
a store that stops answering or dies during a wait, nothing (or another program) on the port; hostile
clients (malformed frames, unread answers, thousands of connections) and binding the address given."""

from __future__ import annotations

import os
import resource
import socket
import struct
import threading
import time
import uuid

import pytest
from support.frames import HELLO, Raw, keys, s, u64
from support.processes import wait_for

from launcher.tcpstore import MAX_VALUE, StoreClient, StoreError, StoreServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ours(server):
    """Our server (tests/integration/conftest.py), named beside torch's."""
    return server


def fresh() -> str:
    return uuid.uuid4().hex[:8] + "/"


def test_many_waiters_wake_together_time_out_alone(ours):
    k = fresh()
    results: dict[str, list] = {"go": [], "both": [], "never": []}

    def waiter(kind: str, ks: list[str], timeout: float) -> None:
        c = StoreClient("127.0.0.1", ours.port, timeout=5)
        t = time.monotonic()
        ok = c.wait(ks, timeout)
        results[kind].append((ok, time.monotonic() - t, c.add(k + "after", 1) > 0))  # still in step
        c.close()

    plan = [("go", [k + "go"], 10)] * 8 + [("both", [k + "a", k + "b"], 10)] * 4 + [("never", [k + "never"], 0.3)] * 4
    threads = [threading.Thread(target=waiter, args=p, daemon=True) for p in plan]
    for t in threads:
        t.start()
    setter = StoreClient("127.0.0.1", ours.port, timeout=5)
    wait_for(lambda: len(results["never"]) == 4, timeout=10, what="the 0.3 s waits to time out")
    assert results["go"] == [] and results["both"] == []  # every waiter is waiting: none woke early
    assert [r[0] for r in results["never"]] == [False] * 4
    setter.set(k + "go", b"")
    setter.compare_set(k + "a", b"", b"1")  # a key made by compare_set wakes waiters too
    wait_for(lambda: len(results["go"]) == 8, timeout=10, what="the waiters on 'go' to wake")
    assert results["both"] == []  # "b" is still missing
    setter.add(k + "b", 1)
    for t in threads:
        t.join(10)
    assert all(ok and after for ok, _, after in results["go"] + results["both"]) and len(results["both"]) == 4
    assert all(0.2 < secs < 2 for _, secs, _ in results["never"])


class FakeStore:
    """A server that answers the handshake, then only what `script` says: {op byte: reply bytes}."""

    def __init__(self, script: dict[int, bytes]):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port, self.script, self.conns = self.listener.getsockname()[1], script, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.conns.append(conn)
        hello = b""
        while len(hello) < 10:
            chunk = conn.recv(10 - len(hello))
            if not chunk:  # the client left: a loop on b"" would spin a core for the rest of the session
                return
            hello += chunk
        conn.sendall(hello[6:10])  # the nonce
        while True:
            try:
                data = conn.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            reply = self.script.get(data[0])
            if reply:
                conn.sendall(reply)

    def close(self) -> None:
        self.listener.close()
        for c in self.conns:
            c.close()


def test_keys_that_arrive_as_the_wait_is_cancelled_count_as_arrived():
    fake = FakeStore({12: b"\x00\x01", 5: b"\x00"})  # CANCEL_WAIT -> STOP_WAITING then WAIT_CANCELED; CHECK -> READY
    try:
        c = StoreClient("127.0.0.1", fake.port, timeout=2)
        assert c.wait(["k"], 0.1) is True  # torch's client calls this a timeout; the keys are there
        assert c.check(["k"]) is True  # and the stream is still in step
    finally:
        fake.close()


def test_a_store_that_stops_answering_is_an_error_within_the_answer_timeout():
    fake = FakeStore({})  # a frozen store: never answers after the handshake
    try:
        c = StoreClient("127.0.0.1", fake.port, timeout=0.5)
        t = time.monotonic()
        with pytest.raises(StoreError, match="no answer within 0.5 s"):
            c.wait(["k"], 0.2)  # the wait runs out, the cancel is never answered
        assert time.monotonic() - t < 2
        with pytest.raises(StoreError):
            c.check(["k"])  # the connection is closed for good
    finally:
        fake.close()


def test_a_store_that_dies_during_a_wait_is_an_error_not_a_timeout():
    server = StoreServer("127.0.0.1", 0)
    c = StoreClient("127.0.0.1", server.port, timeout=5)
    threading.Timer(0.3, server.close).start()
    t = time.monotonic()
    with pytest.raises(StoreError, match="closed the connection"):
        c.wait(["never"], 10)
    assert time.monotonic() - t < 3


def test_connecting_to_nothing_retries_then_fails(ours):
    port = ours.port
    ours.close()
    t = time.monotonic()
    with pytest.raises(StoreError, match="Connection refused, retried for 0.6 s"):
        StoreClient("127.0.0.1", port, timeout=1, connect_timeout=0.6)
    assert 0.5 < time.monotonic() - t < 3
    holder: list = []
    late = threading.Timer(0.5, lambda: holder.append(StoreServer("127.0.0.1", port)))
    late.start()
    try:
        assert StoreClient("127.0.0.1", port, timeout=1, connect_timeout=10).add("x", 1) == 1  # waits for the store
    finally:
        late.join()
        for srv in holder:
            srv.close()


def test_another_program_on_the_port_is_named():
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel does), never answers
    try:
        t = time.monotonic()
        with pytest.raises(StoreError, match="never answered within 0.5 s .another program on that port"):
            StoreClient("127.0.0.1", silent.getsockname()[1], timeout=0.5, connect_timeout=5)
        assert time.monotonic() - t < 3
    finally:
        silent.close()


# ---------------------------------------------------------------------------------- hostile clients


def test_a_malformed_client_loses_only_its_own_connection(ours):
    good = StoreClient("127.0.0.1", ours.port, timeout=5)
    stalled = Raw(ours.port)
    stalled.sock.sendall(b"\x01" + s(b"half") + u64(1000) + b"x" * 10)  # half a frame, then nothing
    reader = Raw(ours.port)  # sends many requests and never reads the answers
    good.set("fat", b"f" * (1 << 20))
    reader.sock.sendall((b"\x03" + s(b"/fat")) * 200)  # 200 MiB of answers it will never read
    hostile = {
        "no-validate": b"\x0d" + b"\0" * 4,
        "wrong-magic": b"\x00" + b"\xde\xad\xbe\xef",
        "unknown-op": HELLO + b"\xff",
        "huge-key": HELLO + b"\x01" + u64(1 << 62),
        "huge-count": HELLO + b"\x0a" + u64(1 << 40),
        "huge-value": HELLO + b"\x01" + s(b"k") + u64(MAX_VALUE + 1),
        "add-on-text": HELLO + b"\x01" + s(b"/t") + s(b"text") + b"\x04" + s(b"/t") + struct.pack("<q", 1),
        "random": HELLO + os.urandom(4096),
    }
    for name, data in hostile.items():
        bad = Raw(ours.port, hello=False)
        bad.sock.sendall(data)
        bad.sock.settimeout(5)
        try:
            while bad.sock.recv(1 << 16):  # answers to what was valid, then the end
                pass
        except ConnectionResetError:
            pass
        except TimeoutError:
            pytest.fail(f"{name}: the server kept the connection")
        bad.close()
        t = time.monotonic()
        assert good.add("count", 1) >= 1 and good.get("fat") == b"f" * (1 << 20), name
        assert time.monotonic() - t < 2, name
    assert good.get("t") == b"text"  # the store itself is fine
    assert Raw(ours.port).ask(b"\x05" + keys(b"/fat")) == b"\x00"
    stalled.close()
    reader.close()
    good.close()


def test_thousands_of_connections(ours):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    n = 2000
    if hard < 2 * n + 100:
        pytest.skip(f"needs {2 * n + 100} file descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2 * n + 100), hard))
    clients = []
    try:
        clients = [StoreClient("127.0.0.1", ours.port, timeout=20) for _ in range(n)]
        done: list[int] = []
        threads = [
            threading.Thread(target=lambda c=c: done.append(c.add("count", 1)), daemon=True) for c in clients[:200]
        ]
        for t in threads:
            t.start()
        for c in clients[200:]:
            c.add("count", 1)
        for t in threads:
            t.join(20)
        assert len(done) == 200 and clients[0].add("count", 0) == n
    finally:
        for c in clients:
            c.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_binds_exactly_the_address_given():
    a = StoreServer("127.0.0.1", 0)
    b = StoreServer("127.0.0.2", a.port)  # the same port on another address: possible only without the wildcard
    try:
        for server, value in ((a, b"A"), (b, b"B")):
            StoreClient(server.host, server.port, timeout=5).set("who", value)
        assert StoreClient("127.0.0.1", a.port, timeout=5).get("who") == b"A"
        assert StoreClient("127.0.0.2", a.port, timeout=5).get("who") == b"B"
        with pytest.raises(OSError):
            StoreServer("127.0.0.1", a.port)  # taken is taken
    finally:
        a.close()
        b.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.3", a.port), timeout=2)
