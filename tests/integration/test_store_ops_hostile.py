"""Store ops under hostile clients, each beside torch's libuv server (issue 32 item 7).

Every test runs twice, against torch's libuv server (the reference) and ours, each in a process of
its own (store_host.py), and checks the same behaviour of a well-behaved torch client on both; on
ours it also checks what the server holds against its budget (docs/store.md). Sizes are scaled down
from the campaign's where the behaviour shows as well (each test says so), to stay within a few
hundred MiB and seconds on a shared 2-core host.
  STALL_BOUND  the longest a probing client may wait on another client's ops (target 0.5 s; the
               bound leaves room for a busy host; the tests print what they measured)
"""

from __future__ import annotations

import datetime
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import forks, needs
from support.frames import HELLO, keys, s, u64
from support.processes import wait_for

from launcher.tcpstore import StoreServer
from launcher.tcpstore import server as server_mod

pytestmark = [pytest.mark.timeout(120), needs.torch]

ROOT = Path(__file__).resolve().parents[2]
HOST = Path(__file__).with_name("store_host.py")
BUDGET = 32 << 20  # ours, scaled down from 256 MiB so that a few clients fill it
STALL_BOUND = 1.0
SLACK = 2 << 20  # what the budget lets through beyond itself: replies under 64 KiB, the request being parsed


def ping(nonce: int) -> bytes:
    return b"\x0d" + struct.pack("<I", nonce)


class Host:
    """store_host.py: `kind` ("libuv" or "ours") serving on `port`; `stats()` says what it holds."""

    def __init__(self, kind: str, budget: int | None = BUDGET):
        self.kind = kind
        args = [kind] + ([str(budget)] if budget else [])
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCH_CPP_LOG_LEVEL": "ERROR"}
        if kind == "libuv":  # forked from a process that imported torch once (support/forks.py)
            self.proc = forks.popen(HOST.read_text(), *args, env=env)
        else:
            pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
            self.proc = subprocess.Popen([sys.executable, str(HOST), *args], text=True, env=env, **pipes)
        self.port = int(self.proc.stdout.readline())

    def stats(self) -> dict[str, int]:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(params=["libuv", "ours"])
def host(request):
    h = Host(request.param)
    yield h
    h.close()


@pytest.fixture
def opened():
    socks: list[socket.socket] = []

    def open_(port: int, first: bytes = b"", rcvbuf: int = 0) -> socket.socket:
        sock = socket.socket()
        socks.append(sock)
        if rcvbuf:  # before connecting: it sets the window the kernel offers
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", port))
        sock.sendall(HELLO + first)
        return sock

    yield open_
    for sock in socks:
        sock.close()


def torch_client(port: int, timeout: float = 30):
    import torch.distributed as dist  # here, not at collection (support/needs.py)

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=timeout))


def readable(socks: list[socket.socket]) -> int:
    return len(select.select(socks, [], [], 0)[0])


def read_exactly(sock: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        chunk = sock.recv(min(1 << 20, n - len(got)))
        if not chunk:
            raise AssertionError(f"closed after {len(got)} of {n} bytes")
        got += chunk
    return bytes(got)


def closed_or(sock: socket.socket, want: bytes) -> str:
    """What the peer did with a request whose answer is `want`: 'answered' or 'closed'."""
    try:
        got = sock.recv(len(want))
    except ConnectionResetError:
        return "closed"
    if not got:
        return "closed"
    assert got == want, got
    return "answered"


def hung_up(sock: socket.socket) -> bool:
    """The peer closed `sock` (looked at without waiting)."""
    if not readable([sock]):
        return False
    try:
        return sock.recv(1 << 16) == b""
    except ConnectionResetError:
        return True


class Prober:
    """A torch client asking CHECK in a loop from a thread: the longest one took is `worst`."""

    def __init__(self, port: int):
        self.client = torch_client(port)
        self.worst, self.count, self.errors = 0.0, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                self.client.check(["probe"])
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(repr(e))
                return
            self.worst = max(self.worst, time.monotonic() - t)
            self.count += 1
            self._stop.wait(0.01)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)


def test_compare_set_answers_wait_for_the_budget(host, opened):
    """A 32-byte mismatching COMPARE_SET answers the stored value. Scaled from 300 clients: 24 that
    never read (a 64 KiB receive window, so that the kernel holds little), an 8 MiB value (192 MiB of
    answers; our budget here is 32 MiB). A client that reads gets its GET and SET served on both;
    ours holds no more than its budget."""
    c = torch_client(host.port)
    big = b"v" * (8 << 20)
    c.set("big", big)
    assert c.get("big") == big  # landed: the others' connections see it
    before = host.stats()
    greedy = [opened(host.port, b"\x02" + s(b"/big") + s(b"x") + s(b"y"), rcvbuf=1 << 16) for _ in range(24)]
    wait_for(lambda: readable(greedy) >= 4, 20, "the first answers to be sent")
    t = time.monotonic()
    assert c.get("big") == big
    c.set("other", b"o" * (1 << 20))
    assert c.get("other") == b"o" * (1 << 20)
    took = time.monotonic() - t
    after = host.stats()
    print(
        f"{host.kind}: an 8 MiB GET and a 1 MiB SET took {took:.2f} s; "
        f"RSS {before['rss'] >> 20} -> peak {after['hwm'] >> 20} MiB"
    )
    assert took < 10
    if host.kind == "ours":
        assert after["peak_held"] <= BUDGET + SLACK, after
        assert after["hwm"] - before["rss"] < 2 * BUDGET, (before, after)


def test_wait_registrations_count_in_the_budget(host, opened):
    """A WAIT on many absent keys holds memory while it waits. Scaled from 60 connections of 131,072
    keys: 24 of 16,384 keys (~1 MiB each on ours, whose waits may hold half its 32 MiB budget). A
    fresh client is served meanwhile; once the keys exist every wait still open is answered (ours
    closed those it could not hold, at once)."""
    names = [b"/w/%05d" % i for i in range(16384)]
    before = host.stats()
    waiters = [opened(host.port, b"\x06" + keys(*names)) for _ in range(24)]
    c = torch_client(host.port)
    t = time.monotonic()
    c.set("x", b"1")
    assert c.get("x") == b"1"
    took = time.monotonic() - t
    during = host.stats()
    c.multi_set([k[1:].decode() for k in names], [b"1"] * len(names))
    for w in waiters:
        w.settimeout(20)
    ends = [closed_or(w, b"\x00") for w in waiters]
    after = host.stats()
    print(
        f"{host.kind}: fresh client {took:.2f} s; waits {ends.count('answered')} answered, {ends.count('closed')} "
        f"closed; RSS {before['rss'] >> 20} -> {during['rss'] >> 20} MiB while waiting, peak {after['hwm'] >> 20}"
    )
    assert took < STALL_BOUND + 1
    assert ends.count("answered") >= 8, ends
    if host.kind == "libuv":
        assert ends.count("closed") == 0
    else:
        assert ends.count("closed") >= 1, ends
        assert after["peak_held"] <= BUDGET + SLACK, after
        assert after["hwm"] - before["rss"] < 2 * BUDGET, (before, after)
        wait_for(lambda: host.stats()["held"] < SLACK, 10, "the waits' memory to be released")


def test_appends_cost_what_they_append(host, opened):
    """APPEND grows a value by what it appends, not by copying it. Scaled from 8 connections: 4
    pipelining 40,000 APPENDs of 23 bytes each to one key (3.7 MB at the end); a probing client is
    never held up past STALL_BOUND, and the value is whole on both."""
    n, piece = 40_000, b"a" * 23
    frame = (b"\x09" + s(b"/app") + s(piece)) * n
    with Prober(host.port) as probe:
        t = time.monotonic()
        appenders = [opened(host.port, frame + ping(i)) for i in range(4)]
        for i, a in enumerate(appenders):
            assert read_exactly(a, 4) == struct.pack("<I", i)
        took = time.monotonic() - t
    assert not probe.errors, probe.errors
    print(f"{host.kind}: 160,000 appends in {took:.2f} s; the probe's longest wait {probe.worst * 1000:.0f} ms")
    assert len(torch_client(host.port).get("app")) == 4 * n * len(piece)
    assert probe.worst < STALL_BOUND or host.kind == "libuv"  # the bound is ours; libuv's is printed


def test_add_on_a_long_run_of_digits(host, opened):
    """ADD reads the number at the start of a value as stoll does: 8 MiB of zeros ending in 7 is 7
    (both answer 8); 8 MiB of nines is past int64 (both close the connection). Neither holds anyone up."""
    c = torch_client(host.port)
    c.set("zeros", b"0" * ((8 << 20) - 1) + b"7")
    c.set("nines", b"9" * (8 << 20))
    t = time.monotonic()
    assert c.add("zeros", 1) == 8
    took = time.monotonic() - t
    with pytest.raises(Exception):  # noqa: B017 - torch raises its DistNetworkError when the server hangs up
        torch_client(host.port).add("nines", 1)
    with Prober(host.port) as probe:
        adders = [opened(host.port, b"\x04" + s(b"/nines") + struct.pack("<q", 1)) for _ in range(16)]
        for a in adders:
            a.settimeout(20)
            assert closed_or(a, b"x" * 8) == "closed"
    print(
        f"{host.kind}: ADD on 8 MiB of digits {took * 1000:.0f} ms; "
        f"the probe's longest wait {probe.worst * 1000:.0f} ms"
    )
    assert not probe.errors, probe.errors
    assert (took < STALL_BOUND and probe.worst < STALL_BOUND) or host.kind == "libuv"


def test_half_received_requests_count_as_the_objects_parsed(host, opened):
    """A MULTI_SET never finished holds its parsed pairs (a tuple and two bytes objects each, ~6 times
    its wire bytes for 4-byte keys and values). Scaled from 225 MiB of wire: 8 connections of 100,000
    pairs (2.4 MB each). Ours counts them as objects and closes those past its budget; a fresh client
    is served on both."""
    pairs = b"".join(s(b"k%03d" % (i % 1000)) + s(b"v%03d" % (i % 1000)) for i in range(100_000))
    before = host.stats()
    senders = [opened(host.port, b"\x0b" + u64(128 << 10) + pairs) for _ in range(8)]
    if host.kind == "ours":  # libuv leaves what it has not parsed in the kernel's buffers: nothing to wait for
        wait_for(lambda: host.stats()["peak_held"] > BUDGET // 2, 30, "the requests to be parsed")
    c = torch_client(host.port)
    c.set("fresh", b"1")
    assert c.get("fresh") == b"1"
    after = host.stats()
    closed = sum(hung_up(x) for x in senders)
    print(f"{host.kind}: RSS {before['rss'] >> 20} -> peak {after['hwm'] >> 20} MiB; {closed} of 8 closed")
    if host.kind == "ours":
        assert after["peak_held"] <= BUDGET + (4 << 20), after  # one read (256 KiB) parsed past the budget
        assert after["hwm"] - before["rss"] < 2 * BUDGET, (before, after)
        assert closed >= 1


def test_values_as_large_as_libuv_serves():
    """APPENDs past 8 MiB, and a LIST_KEYS answer over 64 MiB (8,300 keys of 8 KiB): torch's client
    gets both whole from ours as from libuv (ours at its default budget)."""
    for kind in ("libuv", "ours"):
        h = Host(kind, budget=None)
        try:
            c = torch_client(h.port)
            for _ in range(12):
                c.append("grown", b"x" * (1 << 20))
            assert len(c.get("grown")) == 12 << 20
            names = [f"k{i:05d}" + "y" * 8184 for i in range(8300)]
            for k in names:  # one SET each: libuv parses a MULTI_SET of long keys in quadratic time (13 s per 1,000)
                c.set(k, b"")
            listed = c.list_keys()
            assert len(listed) == 8301 and sum(map(len, listed)) > 64 << 20, (kind, len(listed))
            print(f"{kind}: a 12 MiB appended value and a {sum(map(len, listed)) >> 20} MiB LIST_KEYS, served")
        finally:
            h.close()


def test_list_keys_is_charged_by_its_cost(host, opened):
    """LIST_KEYS answers every key. Scaled from 10^6 keys: 200,000, and 4 connections pipelining 10
    LIST_KEYS each (and reading them): a probing client is never held up past STALL_BOUND."""
    keys = [b"/l/%06d" % i for i in range(200_000)]
    setter = opened(
        host.port,
        b"".join(
            b"\x0b" + u64(50_000) + b"".join(s(k) + s(b"") for k in keys[at : at + 50_000])
            for at in range(0, len(keys), 50_000)
        )
        + ping(9),
    )
    setter.settimeout(120)  # 200,000 keys set: torch's libuv server took over 30 s beside a load of 9
    assert read_exactly(setter, 4) == struct.pack("<I", 9)
    answer = 8 + sum(8 + len(k) for k in keys)
    with Prober(host.port) as probe:
        t = time.monotonic()
        listers = [opened(host.port, b"\x11" * 10 + ping(i)) for i in range(4)]
        results: list[bytes] = [b""] * 4

        def drain(i: int) -> None:
            results[i] = read_exactly(listers[i], 10 * answer + 4)

        readers = [threading.Thread(target=drain, args=(i,)) for i in range(4)]
        for r in readers:
            r.start()
        for r in readers:
            r.join(60)
        took = time.monotonic() - t
    print(
        f"{host.kind}: 40 LIST_KEYS of 200,000 keys in {took:.2f} s; "
        f"the probe's longest wait {probe.worst * 1000:.0f} ms"
    )
    assert not probe.errors, probe.errors
    for i, got in enumerate(results):
        assert got[:8] == u64(len(keys)) and got[-4:] == struct.pack("<I", i)
    assert probe.worst < STALL_BOUND or host.kind == "libuv"  # libuv held the probe up 1.5 s here once


@pytest.mark.parametrize("kind", ["libuv", "ours"])
def test_freed_budget_serves_the_starved_request(kind, opened, monkeypatch):
    """Two clients that never read fill the budget (16 MiB of answers each; the kernel's buffers take
    a few MiB of them); a third's 24 MiB MULTI_GET waits for it. Once the two close, it is answered
    with no other client speaking. Ours in process (32 MiB budget), with its non-reader rule (STALLED)
    put off, so that only the freed budget can serve it."""
    monkeypatch.setattr(server_mod, "STALLED", 60.0)
    srv = StoreServer("127.0.0.1", 0, budget=32 << 20) if kind == "ours" else None
    h = Host("libuv") if kind == "libuv" else None
    port = srv.port if srv else h.port
    try:
        big = b"b" * (8 << 20)
        setter = torch_client(port)
        setter.set("big", big)
        assert setter.get("big") == big  # landed: the others' connections see it
        hogs = [opened(port, b"\x0a" + keys(b"/big", b"/big"), rcvbuf=1 << 16) for _ in range(2)]
        wait_for(lambda: readable(hogs) == 2, 20, "both hogs' answers to begin")
        asker = opened(port, b"\x0a" + keys(b"/big", b"/big", b"/big"))
        if srv:
            wait_for(lambda: len(srv._starved) == 1, 10, "the GET to wait for the budget")
        for x in hogs:
            x.close()
        asker.settimeout(10)
        assert read_exactly(asker, 3 * (8 + len(big))) == s(big) * 3
    finally:
        if srv:
            srv.close()
        if h:
            h.close()
