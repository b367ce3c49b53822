"""The store server under hostile and careless clients (issue 23 items 1-3): real sockets, loopback only.

The limits one by one against an in-process StoreServer, then every attack at once against
`launcher store` under a descriptor limit of 1,024 (store_attacker.py beside this file), while a
live node heartbeats and fresh clients come and go. Bounds stated here (docs/store.md):
  FRESH_BOUND  a fresh client is answered (connected, validated, one op) within this many seconds
  PEAK_RSS     the store process's peak memory under every attack at once
"""

from __future__ import annotations

import json
import logging
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.frames import HELLO, keys
from support.ports import free_port
from support.processes import wait_for

from launcher.tcpstore import StoreClient, StoreError, StoreServer
from launcher.tcpstore import server as server_mod
from launcher.tcpstore.wire import PING

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]
ATTACKER = Path(__file__).with_name("store_attacker.py")
FRESH_BOUND = 10.0
PEAK_RSS = 512 << 20


def multi_get(*ks: bytes) -> bytes:
    return b"\x0a" + keys(*ks)


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        return sock.recv(1 << 16) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


@pytest.fixture
def opened():
    socks: list[socket.socket] = []

    def open_(port: int, first: bytes = b"") -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        socks.append(sock)
        if first:
            sock.sendall(first)
        return sock

    yield open_
    for sock in socks:
        sock.close()


@pytest.fixture
def servers():
    made: list[StoreServer] = []

    def make(**kw) -> StoreServer:
        made.append(StoreServer("127.0.0.1", 0, **kw))
        return made[-1]

    yield make
    for srv in made:
        srv.close()


def test_a_connection_that_never_validates_is_closed_at_the_handshake_deadline(servers, opened):
    srv = servers(handshake=0.3)
    silent, validated = opened(srv.port), opened(srv.port, HELLO)
    wait_for(lambda: closed_by_peer(silent), 10, "the silent connection to be closed")
    assert not closed_by_peer(validated)  # a client that validated may stay idle as long as it likes


def test_at_the_cap_a_newcomer_is_refused_with_a_clear_answer(servers, caplog):
    srv = servers(max_conns=2)
    held = [StoreClient("127.0.0.1", srv.port, timeout=5) for _ in range(2)]
    try:
        with caplog.at_level(logging.INFO):
            with pytest.raises(StoreError, match="at its cap of connections and refused"):
                StoreClient("127.0.0.1", srv.port, timeout=5, connect_timeout=2.5)
        assert "cannot reach the store at 127.0.0.1" in caplog.text  # said while it retried (issue 25)
        assert srv.refused >= 1
        assert any("at its cap of 2 connections" in r.getMessage() for r in caplog.records if r.levelno >= 30)
        held[0].close()
        wait_for(lambda: len(srv._conns) < 2, 5, "the server to see the close")
        StoreClient("127.0.0.1", srv.port, timeout=5).close()  # room again
    finally:
        for c in held:
            c.close()


def test_at_the_cap_a_connection_silent_for_a_while_makes_room(servers, opened):
    srv = servers(max_conns=2)
    silent = [opened(srv.port) for _ in range(2)]
    wait_for(lambda: len(srv._conns) == 2, 5, "both silent connections accepted")
    c = StoreClient("127.0.0.1", srv.port, timeout=5, connect_timeout=5)  # refused until one is EVICT_AFTER old
    c.set("k", b"v")
    assert c.get("k") == b"v"
    c.close()
    assert any(closed_by_peer(x) for x in silent)


def test_a_reply_over_the_frame_limit_is_refused_before_it_is_built(servers, opened):
    """100 copies of an 8 MiB value (800 MiB): the reply is sized first; only that connection goes."""
    srv = servers()
    writer = StoreClient("127.0.0.1", srv.port, timeout=10)
    writer.set("big", b"v" * (8 << 20))
    assert writer.get("nothing", False) == b""  # the set has landed
    srv.peak_held = srv.held
    greedy = opened(srv.port, HELLO + multi_get(*[b"/big"] * 100))
    wait_for(lambda: closed_by_peer(greedy), 10, "the greedy connection to be closed")
    assert srv.peak_held < 1 << 20  # nothing of the 800 MiB was queued
    assert writer.get("big") == b"v" * (8 << 20)  # everyone else is served as before
    writer.close()


def test_unread_replies_share_one_budget_and_a_reply_that_does_not_fit_waits(servers, opened):
    budget = 64 << 20
    srv = servers(budget=budget)
    writer = StoreClient("127.0.0.1", srv.port, timeout=10)
    writer.set("big", b"v" * (8 << 20))
    assert writer.get("nothing", False) == b""  # the set has landed
    ask = HELLO + multi_get(*[b"/big"] * 7)  # a 56 MiB reply each
    readers = [opened(srv.port, ask) for _ in range(5)]  # none reads
    wait_for(lambda: len(srv._starved) == 4, 20, "four replies to wait for the budget")
    assert srv.peak_held <= budget
    assert writer.get("big") == b"v" * (8 << 20)  # a reply to a client that reads is not held up by them
    want, got = 7 * (8 + (8 << 20)), dict.fromkeys(readers, 0)
    deadline = time.monotonic() + 20
    while max(got.values()) < want and time.monotonic() < deadline:  # the one whose reply was built reads it
        for r in select.select(readers, [], [], 1)[0]:
            got[r] += len(r.recv(1 << 20))
    assert max(got.values()) == want
    # the next reply built (3 left waiting), or more: on a busy host a reader this loop reached late was
    # closed for leaving its reply unread past STALLED, and the budget went to the next one
    wait_for(lambda: len(srv._starved) <= 3, 20, "the next reply to be built")
    assert srv.peak_held <= budget
    writer.close()


def test_a_server_without_ping_is_greeted_the_old_way(servers):
    """torch 2.4's server has no PING (issue 24): it drops a connection that sends one."""
    srv = servers()
    for op in [op for op in srv.handlers if op >= PING]:  # torch 2.4's ops end at CANCEL_WAIT
        del srv.handlers[op]
    c = StoreClient("127.0.0.1", srv.port, timeout=5, session=5)  # SESSION is dropped too: a plain client
    c.set("k", b"v")
    assert c.get("k") == b"v" and not c.extended
    c.close()


def test_a_store_host_under_a_low_hard_limit_says_so_once():
    code = (
        "import logging, resource\n"
        "logging.basicConfig(format='%(levelname)s %(message)s')\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))\n"
        "from launcher.tcpstore import StoreServer\n"
        "a = StoreServer('127.0.0.1', 0, expect=2000)\n"
        "b = StoreServer('127.0.0.1', 0, expect=2000)\n"
        "print(a.max_conns)\n"
        "a.close(); b.close()\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if "open-file limit" in x]
    assert len(lines) == 1 and "ulimit -n" in lines[0], r.stderr
    assert int(r.stdout) == 1024 - server_mod.RESERVE


def test_a_soft_limit_below_the_hard_one_is_raised():
    code = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "from launcher.tcpstore import StoreServer\n"
        "StoreServer('127.0.0.1', 0).close()\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.stdout.strip() == "True", r.stderr


# ------------------------------------------------------------------------------------ every attack at once


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))


def low_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


@pytest.fixture
def store_process():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "store", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=low_limit,
    )
    try:
        assert "serving on" in proc.stdout.readline()
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def attack(port: int, seconds: float, **counts: int) -> subprocess.Popen:
    flags = [f"--{k}={v}" for k, v in counts.items()]
    return subprocess.Popen(
        [sys.executable, str(ATTACKER), str(port), str(seconds), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096)),
    )


EVERY_ATTACK = {"idle": 1100, "slow": 200, "trickle": 24, "big": 1, "nonread": 30}


def test_every_attack_at_once_a_live_node_and_fresh_clients_are_served(store_process):
    """`launcher store` under a limit of 1,024 descriptors: 1,100 idle, 200 slow, 24 trickling, a
    100-copy MULTI_GET of 8 MiB again and again, 30 clients that never read their 56 MiB replies.
    A node heartbeating through it is never late past FRESH_BOUND, nor is a fresh client."""
    proc, port = store_process
    node = StoreClient("127.0.0.1", port, timeout=FRESH_BOUND, session=11, reconnect=5)
    attacker = attack(port, 20, **EVERY_ATTACK)
    fresh, beats, errors = [], [0], []
    stop = threading.Event()

    def heartbeat() -> None:
        try:
            while not stop.is_set():
                node.add("hb", 1)
                beats[0] += 1
                stop.wait(0.2)
        except StoreError as e:
            errors.append(f"the live node: {e}")

    beater = threading.Thread(target=heartbeat)
    beater.start()
    try:
        while attacker.poll() is None:
            t = time.monotonic()
            try:
                c = StoreClient("127.0.0.1", port, timeout=FRESH_BOUND, connect_timeout=FRESH_BOUND)
                c.num_keys()
                c.close()
                fresh.append(time.monotonic() - t)
            except StoreError as e:
                errors.append(f"a fresh client: {e}")
            time.sleep(1.0)
    finally:
        stop.set()
        beater.join(FRESH_BOUND + 5)
        out, err = attacker.communicate(timeout=30)
    counts = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    print(
        f"attacks {counts}; fresh clients answered in at most {max(fresh, default=0):.2f} s; beats {beats[0]}; "
        f"peak RSS {peak_rss(proc.pid) >> 20} MiB"
    )
    assert attacker.returncode == 0, err[-2000:]
    assert not errors, errors
    assert len(fresh) >= 5 and beats[0] >= 10, (fresh, beats)
    assert counts["closed_by_server"] + counts["refused"] > 0, counts  # the silent and greedy ones were shut out
    assert counts["unread_replies"] >= 1, counts  # the budget was put to the test
    assert node.add("hb", 0) == beats[0]
    assert peak_rss(proc.pid) < PEAK_RSS, f"{peak_rss(proc.pid) >> 20} MiB"
    assert proc.poll() is None
    node.close()
