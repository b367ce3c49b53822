"""Store clients that reconnect (launcher/tcpstore/client.py, extension 2), with real sockets: a relay between
client and server whose connections a test cuts (FIN or RST), stalls or breaks mid-request; the
server's grace for a session's held keys (an injected clock); ADD_ONCE counted once; a restarted
store told apart from the one the session began on; a store that is gone still an error at once.
"""

from __future__ import annotations

import gc
import logging
import os
import resource
import socket
import struct
import threading
import time
import uuid

import pytest
from support.clock import FakeClock
from support.processes import wait_for
from support.relay import Relay
from support.tcpstore import waiting_on

from launcher.tcpstore import (
    CHANGED,
    GONE,
    MAGIC,
    PROBES,
    SESSION,
    StoreClient,
    StoreError,
    StoreRestarted,
    StoreServer,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def relay(server):
    r = Relay(("127.0.0.1", server.port))
    yield r
    r.close()


@pytest.fixture
def clients():
    """Makes clients (timeout 5 s, reconnecting for 5 s unless told otherwise) and closes them at the end."""
    made: list[StoreClient] = []

    def make(port: int, session: int | None, **kw) -> StoreClient:
        kw = {"timeout": 5, "reconnect": 5, **kw}
        c = StoreClient("127.0.0.1", port, session=session, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def fresh() -> str:
    return uuid.uuid4().hex[:8] + "/"


def in_thread(call) -> list:
    """Run `call` in a thread; the list gets its result once it returns (or the exception it raised)."""
    got: list = []

    def run():
        try:
            got.append(call())
        except Exception as e:
            got.append(e)

    threading.Thread(target=run, daemon=True).start()
    return got


@pytest.mark.parametrize("rst", [False, True], ids=["closed", "reset"])
def test_a_cut_connection_comes_back_in_its_session_and_its_held_key_stays(server, relay, clients, caplog, rst):
    k = fresh()
    holder = clients(relay.port, 11)
    watcher = clients(server.port, 12)
    holder.hold(k + "alive", b"1")
    waiting = in_thread(lambda: holder.wait([k + "go"], 10))  # as an agent's watcher: always in a wait
    watching = in_thread(lambda: watcher.wait_change(k + "change", k + "alive", 1.5))
    wait_for(lambda: waiting_on(server, k + "go") and waiting_on(server, k + "alive"), what="both waits to arrive")
    with caplog.at_level(logging.INFO, logger="launcher.tcpstore.client"):
        assert relay.cut(rst=rst) == 1
        wait_for(lambda: relay.accepted == 2, timeout=5, what="the holder to reconnect")
        wait_for(lambda: watching, timeout=5, what="the watcher's wait to end")
        assert watching == [None]  # the neighbour saw no death: the wait timed out
        watcher.set(k + "go", b"")
        wait_for(lambda: waiting, timeout=5, what="the holder's wait to end")
    assert waiting == [True]  # its WAIT was sent again on the new connection and answered
    assert watcher.check([k + "alive"]) and holder.add(k + "n", 2) == 2
    assert any("reconnected to the store at 127.0.0.1" in r.getMessage() for r in caplog.records), caplog.text


def test_a_watcher_cut_in_wait_change_waits_on_and_misses_nothing(server, relay, clients):
    k = fresh()
    holder = clients(server.port, 21)
    watcher = clients(relay.port, 22)
    holder.hold(k + "alive", b"1")
    got = in_thread(lambda: watcher.wait_change(k + "change", k + "alive", 10))
    wait_for(lambda: waiting_on(server, k + "change"), what="the wait to arrive")
    relay.cut(rst=True)
    wait_for(lambda: relay.accepted == 2 and waiting_on(server, k + "change"), what="the wait sent again")
    assert got == []  # still waiting, on a new connection
    holder.set(k + "change", b"x")
    wait_for(lambda: got, timeout=5, what="the change to be seen")
    assert got == [CHANGED]
    got = in_thread(lambda: watcher.wait_change(k + "change2", k + "alive", 10))
    wait_for(lambda: waiting_on(server, k + "change2"), what="the second wait to arrive")
    relay.cut()
    holder.end_session()  # the neighbour dies (its guard says so) while the watcher reconnects: GONE, not missed
    holder.close()
    wait_for(lambda: got, timeout=5, what="the death to be seen")
    assert got == [GONE] and relay.accepted == 3


def test_an_add_whose_answer_was_lost_is_counted_once(server, relay, clients):
    k = fresh()
    c = clients(relay.port, 31)
    relay.cut_next(to_server=False)  # the server counts it; its answer never arrives
    assert c.add(k + "n", 1) == 1  # sent again on a new connection: the first sum, not 2
    assert c.add(k + "n", 0) == 1 and relay.accepted == 2
    relay.cut_next(to_server=True)  # a write without an answer, lost on the way
    c.set(k + "s", b"v")
    assert c.get(k + "s") == b"v" and relay.accepted == 3  # the next request found the break and sent both
    relay.cut_next(to_server=False)
    assert c.compare_set(k + "c", b"", b"mine") == b"mine"  # as the protocol uses it: safe to send again
    relay.cut_next(to_server=False)
    c.hold(k + "h", b"1")
    assert c.check([k + "h"]) and relay.accepted == 5


@pytest.fixture
def graceless():
    """A server that ends a session the moment its last connection closes (no grace), behind a relay
    -> (server, relay)."""
    server = StoreServer("127.0.0.1", 0, grace=0)
    relay = Relay(("127.0.0.1", server.port))
    yield server, relay
    relay.close()
    server.close()


def test_an_add_in_flight_when_the_session_was_let_go_is_not_sent_again(clients, graceless):
    server, relay = graceless
    k = fresh()
    c = clients(relay.port, 41)
    probe = clients(server.port, 42)
    c.hold(k + "alive", b"1")
    relay.refuse = True
    relay.cut_next(to_server=False)
    got = in_thread(lambda: c.add(k + "n", 1))
    wait_for(lambda: not probe.check([k + "alive"]), timeout=5, what="the session to be let go")
    relay.refuse = False  # the client's next try gets through, to a session the server forgot
    wait_for(lambda: got, timeout=10, what="the add to fail")
    assert isinstance(got[0], StoreError) and "an add was in flight" in str(got[0]), got
    assert probe.add(k + "n", 0) == 1  # counted once, not twice


def test_an_idle_connection_found_closed_is_reopened_before_the_request_goes(clients, caplog, graceless):
    """A connection cut while idle (an agent's main one while its watcher works), then the session's
    other connection closes and the session ends: the add finds the cut before it sends anything,
    so it goes once, on the new connection, and nothing is lost or counted twice."""
    server, relay = graceless
    k = fresh()
    main = clients(relay.port, 45)
    watcher = clients(server.port, 45)
    probe = clients(server.port, 46)
    main.hold(k + "alive", b"1")
    relay.cut()
    watcher.close()
    wait_for(lambda: not probe.check([k + "alive"]), timeout=5, what="the session to end")
    with caplog.at_level(logging.INFO, logger="launcher.tcpstore.client"):
        assert main.add(k + "n", 1) == 1 and probe.add(k + "n", 0) == 1
    assert "(the store closed the connection while it was idle); the store had ended its session" in caplog.text


def test_a_stalled_connection_is_replaced_before_it_is_closed(clients, graceless):
    """No answer (a partition that keeps the connection open): the new connection joins the session
    before the old one closes, so even without a grace the held key never goes."""
    server, relay = graceless
    k = fresh()
    holder = clients(relay.port, 51, timeout=0.5)
    watcher = clients(server.port, 52)
    holder.hold(k + "alive", b"1")
    watching = in_thread(lambda: watcher.wait_change(k + "change", k + "alive", 2))
    assert relay.stall() == 1
    t = time.monotonic()
    assert holder.add(k + "n", 1) == 1  # unanswered for 0.5 s, then sent on a new connection
    assert 0.4 < time.monotonic() - t < 3
    wait_for(lambda: watching, timeout=5, what="the watcher's wait to end")
    assert watching == [None] and watcher.check([k + "alive"])


def test_the_grace_keeps_a_sessions_keys_until_it_is_over(clients):
    clock = FakeClock(100.0)
    server = StoreServer("127.0.0.1", 0, grace=10, clock=clock)
    try:
        k = fresh()
        first = clients(server.port, 61, reconnect=0)
        watcher = clients(server.port, 62)
        first.hold(k + "alive", b"1")
        first.close()
        wait_for(lambda: 61 in server._ending, timeout=5, what="the server to see the close")
        clock.now = 109.9
        watcher.check([k])  # a turn of the server's loop at 109.9: within the grace
        assert watcher.check([k + "alive"])
        again = clients(server.port, 61, reconnect=0)  # back within the grace: it cancels the deletion
        clock.now = 300.0
        watcher.check([k])
        assert watcher.check([k + "alive"])
        got = in_thread(lambda: watcher.wait_change(k + "change", k + "alive", 10))
        again.close()
        wait_for(lambda: 61 in server._ending, timeout=5, what="the server to see the close")
        clock.now = 309.9
        watcher2 = clients(server.port, 63)
        watcher2.check([k])
        assert got == [] and watcher2.check([k + "alive"])
        clock.now = 310.0  # the grace is over: the next turn deletes the key and wakes the watcher
        watcher2.check([k])
        wait_for(lambda: got, timeout=5, what="the watcher to see the key go")
        assert got == [GONE] and not watcher2.check([k + "alive"])
    finally:
        server.close()


def test_a_restarted_store_is_told_apart(server, clients):
    from launcher.errors import RendezvousConnectionError
    from launcher.rendezvous.c10d import TCPStoreAdapter

    port = server.port
    c = clients(port, 71)
    adapter = TCPStoreAdapter("127.0.0.1", port, 5)
    c.set("k", b"v")
    assert c.boot == adapter.client.boot == server.boot
    server.close()
    again = StoreServer("127.0.0.1", port)  # a new process of the store, on the same port, empty
    try:
        with pytest.raises(StoreRestarted):
            c.get("k")
        with pytest.raises(StoreError, match="the store restarted"):
            c.check(["k"])  # closed for good
        with pytest.raises(RendezvousConnectionError, match="the rendezvous store restarted and lost the job's state"):
            adapter.get("k")
        with pytest.raises(StoreRestarted):  # a sibling connection of the session, opened afterwards
            StoreClient("127.0.0.1", port, timeout=5, session=71, boot=c.boot)
    finally:
        adapter.close()
        again.close()


def test_a_store_that_is_gone_is_an_error_at_once(server, clients, caplog):
    c = clients(server.port, 81)
    c.set("k", b"v")
    with caplog.at_level(logging.DEBUG, logger="launcher.tcpstore.client"):
        got = in_thread(lambda: c.wait(["never"], 10))
        wait_for(lambda: waiting_on(server, "never"), what="the wait to arrive")
        t = time.monotonic()
        server.close()
        wait_for(lambda: got, timeout=5, what="the wait to fail")
    assert time.monotonic() - t < 2  # refused: nothing to wait for, a new store would have lost the keys anyway
    assert isinstance(got[0], StoreError), got
    assert str(got[0]).startswith(
        "the store closed the connection; could not reconnect (Connection refused: no store listens there any more)"
    ), got
    gave_up = [r for r in caplog.records if "gave up reconnecting to the store at 127.0.0.1" in r.getMessage()]
    # said at DEBUG only: the error says it, and a store gone as a clean job ends is no news (issue 23 item 10)
    assert gave_up and all(r.levelno == logging.DEBUG for r in gave_up)


def test_a_sibling_connection_to_a_store_that_is_gone_is_an_error_at_once(server):
    """A node's second connection (its round watcher's, its leaving session's) opened just after the store's
    host left: the store was up, so the refusal ends it, where a first connection keeps retrying (the store
    may not be up yet). It waited out the whole connect timeout: a node's exit held a minute."""
    from launcher.errors import RendezvousError
    from launcher.rendezvous.c10d import TCPStoreAdapter

    adapter = TCPStoreAdapter("127.0.0.1", server.port, 30)
    try:
        adapter.clone().close()  # while the store is up
        server.close()
        t = time.monotonic()
        with pytest.raises(RendezvousError, match="no store listens there any more"):
            adapter.clone()
        assert time.monotonic() - t < 5
    finally:
        adapter.close()


def test_a_store_that_stays_unreachable_is_an_error_after_the_reconnect_time(server, relay, clients):
    c = clients(relay.port, 91, reconnect=1)
    relay.refuse = True  # the relay takes connections and closes them: the store is out of reach
    relay.cut()
    t = time.monotonic()
    with pytest.raises(
        StoreError,
        match=r"(the store closed the connection|Connection reset by peer); could not reconnect "
        r"\((it closed the connection|Connection reset by peer), retried for 1 s\)",
    ):
        c.check(["k"])
    assert 0.9 < time.monotonic() - t < 3


def test_a_request_the_store_drops_each_time_is_an_error_at_once(server, clients):
    c = clients(server.port, 95)
    c.set("text", b"not a number")
    t = time.monotonic()
    with pytest.raises(StoreError, match="closed the connection, each of the 3 times this request was sent"):
        c.add("text", 1)  # the server drops a connection that adds to text
    assert time.monotonic() - t < 2


def test_a_connection_on_a_descriptor_past_1023_is_not_taken_for_closed(server, relay, clients):
    """The idle check works on any descriptor (a store-hosting agent of a big job has thousands)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 1200:
        pytest.skip(f"needs 1,200 file descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    gc.collect()  # a socket of another test's garbage, closed whenever it is collected, opens a hole below
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        for _ in range(5):
            # A descriptor below closed meanwhile (another test's thread ending in this process) would be
            # taken first: fill every hole until the next one free is past 1023.
            probe = os.open(os.devnull, os.O_RDONLY)
            while probe <= 1023:  # a hole: plugged, and the next one looked at
                fillers.append(probe)
                probe = os.open(os.devnull, os.O_RDONLY)
            os.close(probe)
            accepted = relay.accepted
            c = clients(relay.port, 97)
            if c._sock.fileno() > 1023:
                break
            c.close()  # a hole opened between the last look and the connect (1 run in 69): once more
        assert c._sock.fileno() > 1023
        assert [c.add("n", 1) for _ in range(3)] == [1, 2, 3] and c.check(["n"])
        assert relay.accepted == accepted + 1  # no reconnect
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_version_1_client_reads_what_it_always_did(server):
    """SESSION still answers one u32 (now 3), so a client of extension 1 stays in step."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        sock.sendall(b"\x00" + struct.pack("<I", MAGIC) + b"\xc8" + struct.pack("<Q", 5))
        sock.sendall(b"\xc9" + struct.pack("<Q", 2) + b"/h" + struct.pack("<Q", 1) + b"1")  # HOLD
        got = b""
        while len(got) < 5 and (chunk := sock.recv(16)):  # b"": closed (an endless loop otherwise)
            got += chunk
        assert got == struct.pack("<I", 3) + b"\x00"
    finally:
        sock.close()


def test_a_connection_cut_as_it_asks_for_its_session_is_not_taken_for_torchs_server(clients):
    """torch's server hangs up on SESSION every time; ours does when the connection is cut at that
    moment (a watcher connecting while the network blinks): the client asks again, so it keeps its
    extension (held keys, reconnects) and a clone does not take the store for a restarted one."""
    server = StoreServer("127.0.0.1", 0)
    real, hung = server.handlers[SESSION], []

    def hang_up_once(c, sid: int) -> None:
        if len(hung) < PROBES - 1:
            hung.append(sid)
            server._drop(c)  # what a cut at that moment looks like to the client
            return
        real(c, sid)

    server.handlers[SESSION] = hang_up_once
    try:
        first = clients(server.port, 77)
        assert first.extended and hung == [77] * (PROBES - 1)
        hung.clear()
        clone = clients(server.port, 77, boot=first.boot)  # the watcher's, cut the same way
        assert clone.extended and clone.boot == first.boot and hung == [77] * (PROBES - 1)
    finally:
        server.close()
