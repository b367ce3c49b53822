"""Spares and lost members in the protocol, against the in-memory store of test_protocol_rounds: a spare
takes the lost group rank while the survivor keeps its own; a loss below MIN is charged once, together
with the worker failures it causes; an elastic job above MIN loses a node free of charge; with no
restart left the job closes with the reason; a refill waits replace_timeout (simulated time) and then
closes naming the group rank; a finished job's close tells a spare it succeeded."""

from __future__ import annotations

import threading

import pytest
from support.clock import FakeClock
from test_protocol_rounds import MemoryStore, agent, join_all, node

from launcher.errors import RendezvousClosedError
from launcher.rendezvous.api import Cause, WaitKind
from launcher.rendezvous.spares import read_spares


def lose(store: MemoryStore, survivor, r: int, n: int, g: int) -> None:
    """What the dead node's neighbour does: one rule for a lost member."""
    survivor.losses.lost(store, r, n, g, f"node with group rank {g} died")


def test_a_spare_takes_the_lost_group_rank_and_the_survivor_keeps_its_own():
    store = MemoryStore()
    a, b, spare = (agent(store, node(name, lo=2, hi=2), port=30000 + i) for i, name in enumerate("abs"))
    first = {x.node.node_id: r for x, r in zip((a, b), join_all([a, b]))}
    told: list = []
    result: list = []
    waiting = threading.Thread(
        target=lambda: result.append(spare.next_round(Cause.START, waiting=told.append)), daemon=True
    )
    waiting.start()
    for _ in range(500):  # the spare's seat is taken before it waits
        if read_spares(store, spare.keys, int(store.data.get("job/spares", b"0"))):
            break
        threading.Event().wait(0.01)
    assert [s.node for s in read_spares(store, spare.keys, 1)] == ["s"] and told[0].kind is WaitKind.SPARE
    lost = first["b"].group_rank
    lose(store, a, 0, 2, lost)
    again = join_all([a])[0]  # the survivor re-joins; the spare fills the round
    waiting.join(10)
    assert again.group_rank == first["a"].group_rank and result[0].group_rank == lost
    assert {again.world_size, result[0].world_size} == {4} and again.restart_count == 1
    assert read_spares(store, spare.keys, 1) == []  # it is a member now: its seat is gone


def test_a_loss_below_min_is_charged_once_with_the_worker_failure_it_causes():
    store = MemoryStore()
    a, b = (agent(store, node(name, lo=2, hi=2), port=30000 + i) for i, name in enumerate("ab"))
    join_all([a, b])
    lose(store, a, 0, 2, 1)
    a._report_failure(0, None)  # its workers failed too: the same round, no second charge
    assert store.data["job/restarts"] == b"1" and store.data["job/r0/change"] == b"node with group rank 1 died"
    assert store.data["job/r0/lost1"] == b"node with group rank 1 died"


def test_an_elastic_job_that_stays_at_min_loses_a_node_free_of_charge():
    store = MemoryStore()
    a, b = (agent(store, node(name, lo=1, hi=2), port=30000 + i) for i, name in enumerate("ab"))
    join_all([a, b])
    lose(store, a, 0, 2, 1)
    assert store.data.get("job/restarts", b"0") == b"0" and "job/closed" not in store.data


def test_no_restart_left_a_loss_closes_the_job_with_the_reason():
    store = MemoryStore()
    a, b = (agent(store, node(name, lo=2, hi=2, restarts=0), port=30000 + i) for i, name in enumerate("ab"))
    join_all([a, b])
    lose(store, a, 0, 2, 1)
    assert store.data["job/closed"] == (
        b"node with group rank 1 died; 1 node(s) left, fewer than 2, and no restart left to replace it "
        b"(--max_restarts 0); closed by node a"
    )


def test_a_refill_waits_replace_timeout_then_closes_naming_the_group_rank(caplog):
    store = MemoryStore()
    a, b = (agent(store, node(name, lo=2, hi=2), port=30000 + i) for i, name in enumerate("ab"))
    join_all([a, b])
    lost = b.current.group_rank
    lose(store, a, 0, 2, lost)
    store.clock = a.clock = FakeClock()  # nobody comes: a waits alone, in simulated time
    told: list = []
    with caplog.at_level("INFO", logger="launcher.rendezvous.protocol"), pytest.raises(RendezvousClosedError) as e:
        a.next_round(Cause.MEMBERSHIP, waiting=told.append)
    assert str(e.value).startswith(
        f"the job was closed: no node came to fill group rank {lost} within 300 s (replace_timeout) "
        f"after node with group rank {lost} died; closed by node a"
    )
    assert told and {w.kind for w in told} == {WaitKind.REPLACEMENT}
    assert told[0].line == (
        f"waiting for a node to fill group rank {lost} in round 1 (node with group rank {lost} died): "
        "1 joined of 2; no spare at hand; replace timeout in 295 s"
    )


def test_a_finished_jobs_close_tells_a_spare_it_succeeded():
    store = MemoryStore()
    a = agent(store, node("a"))
    a.next_round(Cause.START)
    a.shutdown(succeeded=True)
    late = agent(store, node("late"))
    with pytest.raises(RendezvousClosedError) as e:
        late.next_round(Cause.START)
    assert e.value.succeeded and "it finished (round 0 ended on all 1 nodes)" in str(e.value)


@pytest.mark.parametrize("first", ["finished", "lost"])
def test_a_member_lost_as_the_other_finished_ends_the_job_as_finished(first):
    """SPMD ranks end together: a member lost while (or after) the other finished the round was finishing
    too. Whichever is told first, the job closes as finished (a spare ends with exit 0), with no charge."""
    store = MemoryStore()
    a, b = (agent(store, node(name, lo=2, hi=2), port=30000 + i) for i, name in enumerate("ab"))
    join_all([a, b])
    lost = b.current.group_rank
    if first == "finished":
        a.shutdown(succeeded=True)
        assert "job/closed" not in store.data  # not the last: b may still be finishing
        lose(store, a, 0, 2, lost)
    else:
        lose(store, a, 0, 2, lost)
        a.shutdown(succeeded=True)
    assert store.data["job/closed"] == b"it finished (round 0 ended on all 2 nodes; 1 lost as the others finished)" + (
        b"; closed by node a"
    )
    assert store.data.get("job/restarts", b"0") == b"0" or first == "lost"  # told first, the loss was charged


def test_a_loss_told_twice_counts_once():
    store = MemoryStore()
    a, b, c = (agent(store, node(name, lo=1, hi=3), port=30000 + i) for i, name in enumerate("abc"))
    join_all([a, b, c])
    lose(store, a, 0, 3, 2)
    lose(store, b, 0, 3, 2)  # a second teller (a spare that found the round empty, the node itself)
    assert store.data["job/r0/left"] == b"1"


def test_a_member_that_departs_as_the_other_finishes_ends_the_job_as_finished_too():
    """Stopped or quarantined in teardown (SPMD: the other finished, so its ranks were past their last
    collective): one verdict for the job, finished, whichever is told first."""
    store = MemoryStore()
    a, b = (agent(store, node(name, lo=2, hi=2), port=30000 + i) for i, name in enumerate("ab"))
    join_all([a, b])
    b.shutdown(succeeded=False, why="quarantined")
    a.shutdown(succeeded=True)
    assert store.data["job/closed"].startswith(b"it finished (round 0 ended on all 2 nodes; 1 lost as the others")
