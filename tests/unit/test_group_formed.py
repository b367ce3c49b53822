"""The bootstrap store tells when the workers' group formed (agent/bootstrap.py): the server counts the
connections that named a key of the group, and every node's GroupWatch waits for its word. A real
server and real clients on loopback."""

from __future__ import annotations

import logging
import socket
import time

from support.ports import free_port
from support.processes import wait_for

from launcher.agent.bootstrap import BootstrapStore, GroupWatch
from launcher.spec import Round
from launcher.tcpstore.client import StoreClient


def round_on(port: int, world: int = 2) -> Round:
    return Round("job", 0, 0, 0, 1, 0, world, "127.0.0.1", port)


def test_the_group_formed_once_every_worker_named_one_of_its_keys(tmp_path):
    clock = [100.0]
    store = BootstrapStore({}, clock=lambda: clock[0])
    try:
        port = free_port()
        rnd, problem = store.open(round_on(port))
        assert problem == "" and rnd.use_agent_store
        a, b = StoreClient("127.0.0.1", port, timeout=5), StoreClient("127.0.0.1", port, timeout=5)
        a.add("init/", 1)  # a worker's connect: not its group
        a.set("default_pg/0//cpu//0/0", b"addr0")
        a.get("default_pg/0//cpu//0/0")  # the same connection again: counted once
        time.sleep(0.3)
        assert store.formed_at() is None
        clock[0] = 107.0
        b.wait(["default_pg/0//cpu//0/0"])
        wait_for(lambda: store.formed_at() is not None, timeout=5, what="the group formed")
        assert store.formed_at() == 107.0
        a.close(), b.close()
    finally:
        watch = store.watch
        store.close()
        watch.join(5)  # no thread of this test closes a descriptor in a later one's


def test_a_group_formed_elsewhere_is_never_seen():
    store = BootstrapStore({})
    try:
        rnd, _ = store.open(round_on(free_port(), world=1))
        c = StoreClient("127.0.0.1", rnd.master_port, timeout=5)
        c.set("my_own_prefix/0/cpu/0", b"x")  # init_process_group(store=...) on a prefix of its own
        time.sleep(0.6)
        assert store.formed_at() is None
        c.close()
    finally:
        watch = store.watch
        store.close()
        watch.join(5)
    assert BootstrapStore({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}).formed_at() is None


def test_a_fresh_round_store_keeps_the_ranks_records_and_nothing_else():
    """A group restart serves a fresh store; the ranks' own records (keys.slot) go on into it, for the
    successors of a node lost whole (docs/memory.md), and no other key of the last round does."""
    from launcher.worker.inplace import keys

    store = BootstrapStore({})
    try:
        port = free_port()
        store.open(round_on(port))
        c = StoreClient("127.0.0.1", port, timeout=5)
        c.set(keys.slot(3), b"rank 3's record")
        c.set("default_pg/0//cpu//0/0", b"addr0")
        assert c.get(keys.slot(3)) == b"rank 3's record"  # a set has no reply: both are in once this answers
        c.close()
        store.open(Round("job", 1, 0, 0, 1, 0, 2, "127.0.0.1", free_port()))  # the next round, a new port
        c = StoreClient("127.0.0.1", store.server.port, timeout=5)
        assert c.get(keys.slot(3)) == b"rank 3's record"
        assert not c.check(["default_pg/0//cpu//0/0"])
        c.close()
    finally:
        watch = store.watch
        store.close()
        watch.join(5)


def test_a_watch_of_a_store_that_refuses_ends_at_close_and_says_nothing(caplog):
    """Another node's round store that is gone (or not up yet): the watch retries quietly and its thread
    ends within a poll of `close()`. (One 30 s try outlived its round, saying "cannot reach the store"
    of a store closed on purpose, into a later test's log.)"""
    caplog.set_level(logging.DEBUG, logger="launcher.tcpstore.client")

    def tried_for(seconds: float) -> bool:
        tries = [r.created for r in caplog.records if "connecting to the store" in r.getMessage()]
        return len(tries) > 1 and tries[-1] - tries[0] > seconds

    with socket.socket() as held:  # bound, not listening: every connect is refused
        held.bind(("127.0.0.1", 0))
        watch = GroupWatch("127.0.0.1", held.getsockname()[1], time.monotonic)
        wait_for(lambda: tried_for(1.5), timeout=10, what="the watch to retry past TELL_AFTER, in a second try")
        watch.close()
        watch.join(2 * GroupWatch.POLL + 1)
        assert not watch._thread.is_alive()
    assert watch.at is None
    assert not [r for r in caplog.records if r.levelno >= logging.INFO], caplog.text
