"""The pure-Python TCPStore (launcher/tcpstore/) against itself and against torch's: op by op in each
pairing (ours <-> ours, our client -> torch's libuv and legacy servers, torch's client -> our server),
held keys, and frame by frame against torch's server (waits, failures, hostile clients and binding:
test_tcpstore_edges.py; launcher runs on either store: tests/e2e/test_c10d_store_agents.py).

torch runs only in subprocesses: its client's list_keys/queue_len keep the GIL while they block,
which would starve a server thread in the same interpreter.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import time
import uuid

import pytest
from support import forks, needs
from support.frames import Raw, keys, s, u64
from support.paths import ROOT
from support.processes import wait_for
from support.tcpstore import torch_store_server, waiting_on

from launcher.tcpstore import (
    CHANGED,
    GONE,
    GRACE,
    MAX_KEY,
    MAX_VALUE,
    StoreClient,
    StoreError,
    StoreTimeout,
)

pytestmark = pytest.mark.timeout(120)
QUIET = {**os.environ, "TORCH_CPP_LOG_LEVEL": "FATAL", "PYTHONPATH": str(ROOT)}


@pytest.fixture
def ours(server):
    """Our server (tests/integration/conftest.py), named beside torch's."""
    return server


@pytest.fixture(scope="module", params=["libuv", "legacy"])
def torch_server(request):
    """torch's own TCPStore server in a subprocess -> (kind, port); a module's tests share it: unique keys."""
    yield from torch_store_server(request.param)


@pytest.fixture(scope="module")
def torch_libuv():
    """torch's default server, the reference for frame-by-frame answers."""
    yield from torch_store_server("libuv")


def fresh() -> str:
    return uuid.uuid4().hex[:8] + "/"


# ---------------------------------------------------------------------------------- op by op, our client


def check_ops(port: int) -> None:
    """Every op our client has, against whichever server listens on `port`."""
    k = fresh()
    c = StoreClient("127.0.0.1", port, timeout=5)
    other = StoreClient("127.0.0.1", port, timeout=5)
    try:
        before = c.num_keys()
        c.set(k + "a", b"1")
        assert c.get(k + "a") == b"1" and other.get(k + "a", wait=False) == b"1"
        assert c.add(k + "n", 5) == 5 and c.add(k + "n", -7) == -2 and c.add(k + "n", 0) == -2
        assert c.get(k + "n") == b"-2"  # ADD keeps decimal text
        assert c.check([k + "a", k + "n"]) and not c.check([k + "a", k + "missing"])
        assert c.compare_set(k + "c", b"", b"first") == b"first"  # absent, expected empty: created
        assert c.compare_set(k + "c", b"wrong", b"x") == b"first"  # mismatch: the value now
        assert c.compare_set(k + "c", b"first", b"second") == b"second"
        assert c.compare_set(k + "d", b"gone", b"x") == b"gone" and not c.check([k + "d"])  # absent, expected set
        c.multi_set([k + "m1", k + "m2"], [b"v1", b""])
        assert c.multi_get([k + "m1", k + "m2"]) == [b"v1", b""]
        c.append(k + "ap", b"ab")
        c.append(k + "ap", b"cd")
        assert c.get(k + "ap") == b"abcd"
        assert c.num_keys() == before + 6  # a n c m1 m2 ap
        assert c.delete_key(k + "m1") and not c.delete_key(k + "m1") and not c.check([k + "m1"])
        t = time.monotonic()
        assert c.wait([k + "late"], 0.2) is False and time.monotonic() - t < 2  # a timeout is an answer
        with pytest.raises(StoreTimeout):
            StoreClient("127.0.0.1", port, timeout=0.2).get(k + "never")
        threading.Timer(0.3, other.set, args=(k + "late", b"here")).start()
        assert c.wait([k + "late", k + "a"], 5) is True and c.get(k + "late") == b"here"
        assert c.get(k + "a") == b"1"  # the connection stayed in step through the cancel
    finally:
        c.close()
        other.close()


def test_ops_ours_to_ours(ours):
    check_ops(ours.port)


def test_ops_our_client_to_torch_server(torch_server):
    check_ops(torch_server[1])


# ---------------------------------------------------------------------------------- held keys (our extension)


def test_a_held_key_lives_while_any_connection_of_its_session_does(ours):
    k = fresh()
    first, second = (StoreClient("127.0.0.1", ours.port, timeout=5, session=7) for _ in range(2))
    watcher = StoreClient("127.0.0.1", ours.port, timeout=5, session=8)
    assert first.extended and second.extended and watcher.extended
    first.hold(k + "alive", b"1")
    assert watcher.wait_change(k + "change", k + "alive", 0.1) is None  # a timeout: the cancel keeps it in step
    first.close()  # one connection of the session goes (a watcher's, a reconnect): no death
    assert watcher.wait_change(k + "change", k + "alive", 0.3) is None and watcher.get(k + "alive", wait=False) == b"1"
    again = StoreClient("127.0.0.1", ours.port, timeout=5, session=7)  # reconnected, same session
    second.close()
    assert watcher.wait_change(k + "change", k + "alive", 0.3) is None
    again.close()  # the session's last connection: the key stays for the lease (a reconnect may come)
    assert watcher.wait_change(k + "change", k + "alive", 0.3) is None and watcher.check([k + "alive"])
    last = StoreClient("127.0.0.1", ours.port, timeout=5, session=7)
    ender = threading.Timer(0.2, last.end_session)  # its death told (its guard's certificate): the key goes now
    ender.start()
    t = time.monotonic()
    assert watcher.wait_change(k + "change", k + "alive", 5) == GONE and time.monotonic() - t < 1
    ender.join(5)  # its answer read before the close (the watcher may hear of the end first)
    last.close()
    assert not watcher.check([k + "alive"])
    threading.Timer(0.2, watcher.set, args=(k + "change", b"x")).start()  # blocking on the change alone
    other = StoreClient("127.0.0.1", ours.port, timeout=5, session=9)
    assert other.wait_change(k + "change", None, 5) == CHANGED
    assert watcher.wait_change(k + "change", k + "alive", 5) == CHANGED  # the change wins over the absence
    with pytest.raises(StoreError, match="use heartbeats"):  # a connection without a session
        StoreClient("127.0.0.1", ours.port, timeout=5).hold(k + "x", b"1")
    other.close()
    watcher.close()


def test_a_killed_holder_without_a_guard_is_gone_at_the_end_of_the_lease(ours):
    """A process that holds a key and is SIGKILLed, no guard to tell its death: to the server that is a
    cut connection, so its neighbour's WAIT_CHANGE answers GONE once the lease (GRACE) is over, not
    sooner (with a guard, at once: test_store_death_rule.py)."""
    k = fresh()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import sys, time
from launcher.tcpstore import StoreClient
a, b = (StoreClient("127.0.0.1", {ours.port}, timeout=5, session=99) for _ in range(2))
a.hold("{k}alive", b"1")
print(a.extended and b.extended, flush=True)
time.sleep(60)
""",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=QUIET,
    )
    try:
        assert holder.stdout.readline().strip() == "True"
        watcher = StoreClient("127.0.0.1", ours.port, timeout=5, session=1)
        got = []
        t = threading.Thread(
            target=lambda: got.append((watcher.wait_change(k + "change", k + "alive", 10), time.monotonic()))
        )
        t.start()
        wait_for(lambda: waiting_on(ours, k + "alive"), what="the watcher's wait to arrive")
        t0 = time.monotonic()
        holder.kill()
        t.join(10)
        assert got and got[0][0] == GONE, got
        print(f"\nthe SIGKILLed holder's key went after {got[0][1] - t0:.3f} s")
        assert GRACE - 0.5 < got[0][1] - t0 < GRACE + 3, got[0][1] - t0
        watcher.close()
    finally:
        holder.kill()
        holder.wait()


def test_torch_servers_answer_the_probe_by_hanging_up_and_the_client_goes_plain(torch_server):
    from launcher.rendezvous.c10d import TCPStoreAdapter
    from launcher.rendezvous.store import Capability

    k = fresh()
    c = StoreClient("127.0.0.1", torch_server[1], timeout=5, session=3)
    assert not c.extended
    c.set(k + "a", b"1")
    assert c.get(k + "a") == b"1" and c.add(k + "n", 2) == 2  # the plain connection that replaced it works
    with pytest.raises(StoreError, match="use heartbeats"):
        c.hold(k + "alive", b"1")
    c.close()
    adapter = TCPStoreAdapter("127.0.0.1", torch_server[1], 5)
    assert adapter.capabilities == frozenset({Capability.DELETE})  # no CRASH: heartbeats alone
    adapter.close()


def test_our_adapter_on_our_server_declares_crash():
    from launcher.rendezvous.c10d import TCPStoreAdapter, serve
    from launcher.rendezvous.store import Capability, Change

    server = serve("127.0.0.1", 0)
    try:
        a = TCPStoreAdapter("127.0.0.1", server.port, 5)
        b = a.clone()
        assert (
            a.capabilities == b.capabilities == frozenset({Capability.DELETE, Capability.CRASH})
            and b.session == a.session
        )
        a.hold("r0/alive1")
        b.close()  # the watcher's connection of each round closes: the agent is still alive
        w = TCPStoreAdapter("127.0.0.1", server.port, 5)
        assert w.wait_change("r0/change", "r0/alive1", 0.2) is None
        a.end_session()  # the agent leaves (or its guard tells its death): at once, no lease
        a.close()
        assert w.wait_change("r0/change", "r0/alive1", 5) is Change.GONE
        w.close()
    finally:
        server.close()


# ---------------------------------------------------------------------------------- torch's client

TORCH_CLIENT = r"""
import datetime, json, sys
import torch.distributed as dist
port, k = int(sys.argv[1]), sys.argv[2]
if port == 0:  # torch's own server, for reference
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = server.port
td = datetime.timedelta
a = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=td(seconds=5))
b = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=td(seconds=5))
out = []
def do(name, f):
    try:
        r = f()
        if isinstance(r, bytes):
            r = r.decode("latin-1")
        elif isinstance(r, list) and r and isinstance(r[0], bytes):
            r = [x.decode("latin-1") for x in r]
        out.append([name, r])
    except Exception as e:
        out.append([name, "error " + type(e).__name__ + ": " + str(e).splitlines()[0][:80]])
do("set", lambda: a.set(k + "a", "1"))
do("get", lambda: b.get(k + "a"))
do("add", lambda: a.add(k + "n", 5))
do("add-again", lambda: b.add(k + "n", -2))
do("get-n", lambda: a.get(k + "n"))
do("check", lambda: a.check([k + "a", k + "n"]))
do("check-missing", lambda: a.check([k + "a", k + "zz"]))
do("cas-create", lambda: a.compare_set(k + "c", "", "first"))
do("cas-mismatch", lambda: a.compare_set(k + "c", "nope", "x"))
do("cas-match", lambda: b.compare_set(k + "c", "first", "second"))
do("cas-absent-expected", lambda: a.compare_set(k + "d", "gone", "x"))
do("cas-absent-stays-absent", lambda: a.check([k + "d"]))
do("multi-set", lambda: a.multi_set([k + "m1", k + "m2"], ["v1", ""]))
do("multi-get", lambda: b.multi_get([k + "m1", k + "m2"]))
do("append", lambda: [a.append(k + "ap", "ab"), a.append(k + "ap", "cd")] and None)
do("get-append", lambda: a.get(k + "ap"))  # a: writes without an answer are ordered per connection only
do("num-keys", lambda: a.num_keys())
do("delete", lambda: a.delete_key(k + "m1"))
do("delete-again", lambda: a.delete_key(k + "m1"))
do("wait-present", lambda: a.wait([k + "a", k + "c"], td(seconds=1)))
do("wait-timeout", lambda: a.wait([k + "late"], td(milliseconds=200)))
do("after-timeout", lambda: a.get(k + "a"))
short = lambda: dist.TCPStore("127.0.0.1", port, is_master=False, timeout=td(milliseconds=200))
do("get-timeout", lambda: short().get(k + "never"))
do("big", lambda: a.set(k + "big", bytes(range(256)) * 4096))
do("big-get", lambda: len(b.get(k + "big")))
do("queue-push", lambda: [a.queue_push(k + "q", "1"), a.queue_push(k + "q", "2")] and None)
do("queue-len", lambda: a.queue_len(k + "q"))
do("queue-pop", lambda: a.queue_pop(k + "q"))
do("queue-pop-2", lambda: a.queue_pop(k + "q", False))
do("queue-pop-empty", lambda: a.queue_pop(k + "q", False))
do("barrier-1", lambda: a.barrier(k + "b1", 1))
do("barrier-timeout", lambda: a.barrier(k + "b2", 2, td(milliseconds=200)))
do("barrier-second", lambda: b.barrier(k + "b2", 2, td(seconds=2)))
do("list-keys", lambda: sorted(x for x in a.list_keys() if x.startswith(k)))
do("still-ok", lambda: a.add(k + "n", 0))
print(json.dumps(out))
"""


def torch_client(port: int, k: str) -> list:
    r = forks.run(TORCH_CLIENT, str(port), k, env=QUIET, timeout=90)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@needs.torch
def test_torch_client_gets_from_our_server_what_torch_server_gives(ours):
    k = fresh()
    theirs, mine = torch_client(0, k), torch_client(ours.port, k)
    assert mine == theirs
    got = dict(mine)
    assert got["get"] == "1" and got["get-n"] == "3" and got["cas-create"] == "first" and got["cas-match"] == "second"
    assert (
        got["cas-mismatch"] == "first"
        and got["cas-absent-expected"] == "gone"
        and got["cas-absent-stays-absent"] is False
    )
    assert (
        got["multi-get"] == ["v1", ""]
        and got["get-append"] == "abcd"
        and got["delete"] is True
        and got["delete-again"] is False
    )
    assert got["wait-timeout"].startswith("error DistStoreError: wait timeout") and got["after-timeout"] == "1"
    assert got["big-get"] == 1 << 20 and got["queue-len"] == 2 and got["queue-pop"] == "1" and got["queue-pop-2"] == "2"
    assert got["queue-pop-empty"].startswith("error") and got["barrier-1"] is None and got["barrier-second"] is None
    assert got["barrier-timeout"].startswith("error") and got["still-ok"] == 3
    assert got["list-keys"] == sorted(f"{k}{x}" for x in ("a", "n", "c", "m2", "ap", "big", "b1", "b2"))


# ---------------------------------------------------------------------------------- frame by frame


def frames(k: bytes) -> dict[str, bytes]:
    def i64(n: int) -> bytes:
        return struct.pack("<q", n)

    return {
        "set": b"\x01" + s(k + b"a") + s(b"1"),
        "get": b"\x03" + s(k + b"a"),
        "get-missing": b"\x03" + s(k + b"missing"),  # libuv: empty; torch's client waits first
        "cas-absent-empty": b"\x02" + s(k + b"c") + s(b"") + s(b"D"),
        "cas-absent-expected": b"\x02" + s(k + b"c2") + s(b"X") + s(b"D"),
        "cas-match": b"\x02" + s(k + b"c") + s(b"D") + s(b"E"),
        "cas-mismatch": b"\x02" + s(k + b"c") + s(b"Z") + s(b"F"),
        "cas-present-empty-expected": b"\x02" + s(k + b"c") + s(b"") + s(b"G"),
        "cas-empty-value": b"\x01" + s(k + b"e") + s(b"") + b"\x02" + s(k + b"e") + s(b"") + s(b"H"),
        "check": b"\x05" + keys(k + b"a", k + b"c") + b"\x05" + keys(k + b"a", k + b"c2"),
        "check-none": b"\x05" + keys(),
        "wait-present": b"\x06" + keys(k + b"a", k + b"a"),
        "wait-then-cancel": b"\x06" + keys(k + b"w") + b"\x0c",
        "cancel-alone": b"\x0c",
        "add": b"\x04" + s(k + b"n") + i64(5) + b"\x04" + s(k + b"n") + i64(-9),
        "add-stoll": b"\x01" + s(k + b"g") + s(b" \t-12abc") + b"\x04" + s(k + b"g") + i64(1) + b"\x03" + s(k + b"g"),
        "add-wraps": b"\x04" + s(k + b"mx") + i64(2**63 - 1) + b"\x04" + s(k + b"mx") + i64(1),
        "add-not-a-number": b"\x01" + s(k + b"x") + s(b"x1") + b"\x04" + s(k + b"x") + i64(1),
        "add-past-int64": b"\x01" + s(k + b"y") + s(b"9" * 30) + b"\x04" + s(k + b"y") + i64(1),
        "multi-get": b"\x0a" + keys(k + b"a", k + b"missing", k + b"c"),
        "multi-set": b"\x0b" + u64(2) + s(k + b"m1") + s(b"1") + s(k + b"m2") + s(b"22") + b"\x03" + s(k + b"m2"),
        "append": b"\x09" + s(k + b"ap") + s(b"ab") + b"\x09" + s(k + b"ap") + s(b"cd") + b"\x03" + s(k + b"ap"),
        "delete": b"\x08" + s(k + b"a") + b"\x08" + s(k + b"a"),
        "queue": b"\x0e"
        + s(k + b"q")
        + s(b"1")
        + b"\x10"
        + s(k + b"q")
        + b"\x0f"
        + s(k + b"q")
        + b"\x0f"
        + s(k + b"q"),
        "barrier": b"\x12" + s(k + b"b") + i64(1) + b"\x12" + s(k + b"b") + i64(3) + b"\x0c" + b"\x03" + s(k + b"b"),
        "key-at-limit": b"\x01" + s(k + b"K" * (MAX_KEY - len(k))) + s(b"v"),
        "key-over-limit": b"\x01" + s(k + b"K" * (MAX_KEY + 1 - len(k))) + s(b"v"),
        "value-over-limit": b"\x01" + s(k + b"v") + u64(MAX_VALUE + 1),
        "unknown-op": b"\x63",
    }


def test_every_frame_answers_as_torch_libuv_server_does(ours, torch_libuv):
    """The same bytes to both servers, case by case on fresh connections: the same answers, the
    same closed connections (compare_set's edge cases, ADD's number parsing, limits, ...)."""
    port = torch_libuv[1]
    k = fresh().encode()
    answers = {}
    for name, frame in frames(k).items():
        a, b = Raw(ours.port), Raw(port)
        answers[name] = (a.ask(frame), b.ask(frame))
        a.close()
        b.close()
    assert {n: x for n, (x, y) in answers.items() if x != y} == {}, {n: v for n, v in answers.items() if v[0] != v[1]}
    got = {n: x for n, (x, _) in answers.items()}
    assert got["get-missing"] == u64(0) and got["cas-absent-expected"] == s(b"X")
    assert got["add-stoll"] == struct.pack("<q", -11) + s(b"-11") and got["add-wraps"][-8:] == struct.pack(
        "<q", -(2**63)
    )
    assert (
        got["add-not-a-number"] == got["add-past-int64"] == got["key-over-limit"] == got["value-over-limit"] == "closed"
    )
    assert got["wait-then-cancel"] == b"\x01" and got["unknown-op"] == "closed"


def test_a_value_at_the_limit_round_trips(ours, torch_server):
    big = os.urandom(MAX_VALUE)
    for port in (ours.port, torch_server[1]):
        k = fresh()
        c = StoreClient("127.0.0.1", port, timeout=10)
        c.set(k + "big", big)
        c.multi_set([f"{k}{i}" for i in range(2000)], [str(i).encode() * 50 for i in range(2000)])
        assert c.get(k + "big") == big
        assert c.multi_get([f"{k}{i}" for i in range(2000)]) == [str(i).encode() * 50 for i in range(2000)]
        c.close()
