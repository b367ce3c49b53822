"""Races in the rendezvous protocol, driven in one process against a real TCPStore server: each
node is an ElasticRendezvous in a thread, and a node's store can be slowed at a chosen step."""

from __future__ import annotations

import threading
import time

from support.rendezvous import agents, client

from launcher.rendezvous.api import Cause
from launcher.spec import Round


class SlowAfterTicket:
    """A node's store that, once the node holds its ticket for round 0, stalls until another node
    has sealed that round: the node then learns of the seal only after taking its ticket."""

    def __init__(self, store, port: int):
        self._store, self._watch = store, client(port)

    def add(self, key: str, amount: int) -> int:
        value = self._store.add(key, amount)
        if key == "job/r0/joined" and amount == 1:
            assert self._watch.wait(["job/r0/sealed"], 10), "nobody sealed round 0"
        return value

    def __getattr__(self, name: str):
        return getattr(self._store, name)


def test_a_ticket_taken_before_the_seal_is_a_member_even_if_it_sees_the_seal_first(store_port):
    """Node A takes ticket 1; node B takes ticket 2 of 2 and seals at once; only then does A look.
    A is in the sealed count, so it must still write its entry: the round forms at once, with both
    (before, A left it unwritten and B waited read_timeout for it, then the round re-formed)."""
    slow, fast = agents(store_port, 2, 2, 2)
    slow.store = SlowAfterTicket(slow.store, store_port)
    results: dict[str, object] = {}

    def ask(name, rdzv) -> None:
        try:
            results[name] = rdzv.next_round(Cause.START)
        except BaseException as e:  # noqa: BLE001 - reported by the assertions below
            results[name] = e

    threads = [threading.Thread(target=ask, args=("slow", slow), daemon=True)]
    threads[0].start()
    probe, deadline = client(store_port), time.monotonic() + 20
    while probe.add("job/r0/joined", 0) < 1:  # A holds ticket 1 before B asks
        assert time.monotonic() < deadline, "the slow node never took a ticket"
        time.sleep(0.01)
    threads.append(threading.Thread(target=ask, args=("fast", fast), daemon=True))
    threads[1].start()
    for t in threads:
        t.join(30)
    results = [results.get("slow"), results.get("fast")]
    assert all(isinstance(r, Round) for r in results), results
    assert [r.round for r in results] == [0, 0], results
    assert sorted(r.group_rank for r in results) == [0, 1]
