"""A spare whose round has no member left ends that round itself, on a real TCPStore: nobody else is left
to. Each node is an ElasticRendezvous in a thread, its watcher heartbeating; a member "dies" when its
store connections close (the server drops its held alive key, as for a SIGKILLed agent), or is "cut off"
when its heartbeats stop while its connection stays open (its key stays held, as for a pulled cable)."""

from __future__ import annotations

import threading

import pytest
from support.ports import free_port
from support.rendezvous import agents, client

from launcher.rendezvous.api import Cause
from launcher.spec import Round
from launcher.tcpstore.server import StoreServer


class Asking:
    """`next_round(START)` of each node on a thread of its own; `results()` once all have answered."""

    def __init__(self, nodes):
        self.answers: dict[int, object] = {}
        self.threads = [threading.Thread(target=self._ask, args=(i, n), daemon=True) for i, n in enumerate(nodes)]
        for t in self.threads:
            t.start()

    def _ask(self, i: int, node) -> None:
        try:
            self.answers[i] = node.next_round(Cause.START)
        except BaseException as e:  # noqa: BLE001 - reported by the assertions
            self.answers[i] = e

    def results(self, timeout: float) -> list[object]:
        for t in self.threads:
            t.join(timeout)
        return [self.answers.get(i, "no answer") for i in range(len(self.threads))]


@pytest.fixture
def server(request):
    """Our store server; `grace`: how long a closed session's held keys outlive it (parametrized)."""
    s = StoreServer("127.0.0.1", free_port(), grace=getattr(request, "param", 0.1))
    yield s
    s.close()


def form_round_0(port: int, nodes: list) -> None:
    """Round 0 of `nodes`, each watching it (heartbeating) as an agent does."""
    rounds = Asking(nodes).results(20)
    assert [r.round for r in rounds if isinstance(r, Round)] == [0, 0], rounds
    for node, rnd in zip(nodes, rounds):
        node.watch(rnd, lambda event: None)


def silence(node) -> None:
    """Its heartbeats stop (the watcher ends, closing its own connection); its main connection stays."""
    node._stop_watch.set()
    node._watcher.join(5)


def kill(*nodes) -> None:
    """Every connection of `nodes` closes, all at once: silenced first, so none tells another's loss."""
    for node in nodes:
        silence(node)
    for node in nodes:
        node.store.close()


def test_both_members_die_at_once_and_the_spare_waits_for_a_replacement_then_runs_with_it(server):
    """Fixed size 2, one spare: both members die at once. The spare finds round 0 empty, tells both losses
    (one restart charged), and round 1 waits for a replacement; a node started then fills it."""
    a, b, spare, late = agents(server.port, 4, 2, 2)
    form_round_0(server.port, [a, b])
    probe = client(server.port)
    waiting = Asking([spare])
    assert probe.wait(["job/spare1"], 10), "the third node never waited as a spare"
    kill(a, b)
    assert probe.wait(["job/r0/change", "job/r0/lost0", "job/r0/lost1"], 10), "nobody ended round 0"
    assert b"found by spare n2" in probe.get("job/r0/lost0") and b"found by spare n2" in probe.get("job/r0/lost1")
    assert probe.add("job/r1/joined", 0) <= 1  # the spare waits in round 1, alone, for a replacement
    filled = Asking([late])
    rounds = waiting.results(20) + filled.results(20)
    assert all(isinstance(r, Round) for r in rounds), rounds
    assert [(r.round, r.world_size, r.restart_count) for r in rounds] == [(1, 4, 1)] * 2
    assert sorted(r.group_rank for r in rounds) == [0, 1]


@pytest.mark.parametrize("server", [2.0], indirect=True)
def test_a_rerun_that_finds_the_dead_runs_keys_still_held_takes_the_job_over(server):
    """The same job id run again while the store still holds the dead run's alive keys (a store frozen with
    the job, resumed as the rerun starts: its keys go a moment later): the rerun's nodes find round 0 full
    and wait as its spares; once the keys are gone they end it and form round 1 together."""
    a, b, c, d = agents(server.port, 4, 2, 2)
    form_round_0(server.port, [a, b])
    kill(a, b)
    rounds = Asking([c, d]).results(30)
    assert all(isinstance(r, Round) for r in rounds), rounds
    assert [(r.round, r.world_size) for r in rounds] == [(1, 4)] * 2


def test_members_cut_off_together_keep_their_keys_and_the_spare_ends_their_round_by_their_heartbeats(server):
    """One member SIGKILLed (its key goes), the other's cable pulled (its connection silent, its key held
    by the server): no neighbour is left to judge the silent one; the spare does, by the heartbeats."""
    a, b, spare = agents(server.port, 3, 2, 2)
    form_round_0(server.port, [a, b])
    probe = client(server.port)
    waiting = Asking([spare])
    assert probe.wait(["job/spare1"], 10), "the third node never waited as a spare"
    silence(b)  # first: its watcher would otherwise see a's key go and tell that loss itself
    kill(a)
    assert probe.wait(["job/r0/change", "job/r0/lost0", "job/r0/lost1"], 15), "nobody ended round 0"
    assert any(probe.multi_get(["job/r0/alive1", "job/r0/alive2"]))  # the silent one's key is still held
    assert probe.add("job/r1/joined", 0) <= 1  # the spare waits in round 1 for replacements
    b.store.close()
    spare.shutdown(succeeded=False, why="test over")
    waiting.results(1)
