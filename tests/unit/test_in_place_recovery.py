"""--recovery in-place, the agent's decisions (launcher/agent/recovery.py), driven through its declared `Host`:
a fake supervisor (its workers are records, its clock the test's), a rendezvous the test gates, and a real
`StoreServer` in process, where the test sets the keys the workers would (`inplace.keys`)."""

from __future__ import annotations

import dataclasses
import queue
import signal
import threading
import typing

import pytest
from support.clock import FakeClock

from launcher.agent.bootstrap import BootstrapStore
from launcher.agent.loop_events import Then
from launcher.agent.members import Member
from launcher.agent.recovery import Host, InPlace, Joined, Recovered, in_place
from launcher.agent.supervisor import Supervisor
from launcher.config import from_flags
from launcher.rendezvous.api import Cause
from launcher.spec import Exit, Failure, Round, Worker, WorkerState
from launcher.tcpstore.client import StoreClient
from launcher.tcpstore.server import StoreServer
from launcher.worker.inplace import keys

NPROC = 3


class Proc:
    """A worker's process as the recovery sees it: a pid, and the exit the supervisor reaped."""

    pidfd = None

    def __init__(self, pid: int):
        self.pid, self.code = pid, None

    def poll(self) -> Exit | None:
        return None if self.code is None else Exit(self.code)


class Rendezvous:
    """One node; each round asked comes once the test opens `gate` (open unless a test closes it)."""

    def __init__(self, port: int):
        self.port, self.number, self.restarts = port, 0, 0
        self.causes: list[Cause] = []
        self.offered: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def next_round(self, cause: Cause, verdict=None, waiting=None) -> Round:
        self.causes.append(cause)
        assert self.gate.wait(10), "the test never let the round form"
        self.number += 1
        self.restarts += cause is Cause.FAILURE
        return make_round(self.number, self.restarts, self.port)

    def offer_port(self, port: int) -> None:
        self.offered.append(port)

    def watch(self, rnd: Round, post) -> None:
        pass

    def shared_store(self):
        return None

    def shutdown(self, succeeded: bool, why: str = "") -> None:
        pass


def make_round(number: int, restarts: int, port: int) -> Round:
    return Round("unit", number, restarts, 0, 1, 0, NPROC, "127.0.0.1", port, use_agent_store=True)


class FakeSupervisor:
    """What `recovery.Host` declares, and nothing more: the workers are records, nothing runs."""

    def __init__(self, server: StoreServer, max_restarts: int = 1):
        self.config = from_flags(
            training_script="worker",
            no_python=True,
            nproc_per_node=str(NPROC),
            max_restarts=max_restarts,
            recovery="in-place",
            environ={},
            quiet=True,
        )
        self.rendezvous = Rendezvous(server.port)
        self.bootstrap = BootstrapStore({})
        self.bootstrap.server = server
        self.round: Round | None = make_round(0, 0, server.port)
        self.members: list[Member] = []
        self.failures: list[Failure] = []
        self.held: tuple[Round, float] | None = None
        self.clock = FakeClock(100.0)
        self.posted: queue.SimpleQueue = queue.SimpleQueue()
        self.events: list[tuple[str, dict]] = []
        self.stops: list[tuple[Then, str | None]] = []
        self.starts: list[tuple[int, int]] = []  # (round, rank)
        self.environ: dict[str, str] = {}
        self._pids = iter(range(20_000, 30_000))
        self.start_ranks(self.round, range(NPROC))
        self.starts.clear()
        self.in_place = in_place(self, self.config, self.environ)

    def post(self, event: object) -> None:
        self.posted.put(event)

    def emit(self, kind: str, **fields: object) -> None:
        self.events.append((kind, fields))

    def root_verdict(self):
        return None

    def watch_round(self, rnd: Round) -> None:
        pass

    def start_ranks(self, rnd: Round, ranks) -> bool:
        for rank in ranks:
            self.starts.append((rnd.round, rank))
            worker = Worker(local_rank=rank, rank=rank, local_world_size=NPROC, world_size=NPROC)
            self.members.append(Member(worker, Proc(next(self._pids)), [], "", ()))  # type: ignore[arg-type]
        return True

    def announce_running(self, rnd: Round, **extra: object) -> None:
        self.emit("running", round=rnd.round, restarts=rnd.restart_count, **extra)

    def stop_workers(self, signum: int, grace: float, then: Then, reason: str | None = None) -> None:
        self.stops.append((then, reason))

    # ------------------------------------------------------------------ what the test does

    def fail(self, *ranks: int, code: int = -signal.SIGKILL) -> str | None:
        """The live workers of `ranks` exit with `code`, reaped as the supervisor does; what `recover` said."""
        failed = []
        for rank in ranks:
            m = next(m for m in self.members if m.worker.rank == rank and m.state is WorkerState.RUNNING)
            m.proc.code, m.state = code, WorkerState.FAILED  # type: ignore[attr-defined]
            rnd = self.round.round if self.round else 0
            self.failures.append(Failure(m.worker, m.proc.pid, Exit(code), self.clock(), "host", rnd, False))
            failed.append(m)
        assert self.in_place is not None
        return self.in_place.recover(failed)

    def joined(self) -> None:
        """The round the recovery asked for came: the loop hands it over, as the supervisor's does."""
        event = self.posted.get(timeout=10)
        assert isinstance(event, Joined), event
        self.in_place.on(event)  # type: ignore[union-attr]

    def kinds(self) -> list[str]:
        return [k for k, _ in self.events]


@pytest.fixture
def store():
    server = StoreServer("127.0.0.1", 0)
    yield server
    server.close()


@pytest.fixture
def sup(store):
    return FakeSupervisor(store)


def client(store: StoreServer) -> StoreClient:
    return StoreClient("127.0.0.1", store.port, timeout=5.0)


def pending_round_one(sup: FakeSupervisor) -> InPlace:
    """Rank 2 killed in round 0: round 1 taken, opened, rank 2's replacement started; the recovery pending."""
    assert sup.fail(2) is None
    sup.joined()
    rec = sup.in_place
    assert rec is not None and rec.pending is not None and rec.pending.round == 1
    assert sup.starts == [(1, 2)] and sup.rendezvous.causes == [Cause.FAILURE]
    return rec


@pytest.mark.timeout(30)
def test_the_supervisor_offers_every_name_the_host_declares():
    declared = {n for n in vars(Host) if not n.startswith("_")} | set(typing.get_type_hints(Host))
    assert declared == {
        "rendezvous", "bootstrap", "round", "members", "failures", "held", "clock",
        "post", "emit", "root_verdict", "watch_round", "start_ranks", "announce_running", "stop_workers",
    }  # fmt: skip
    assert all(callable(getattr(Supervisor, n)) for n in declared if n in vars(Host))
    fields = set(typing.get_type_hints(Host))
    assert all(n in Supervisor.__init__.__code__.co_names for n in fields)  # set in its __init__


@pytest.mark.timeout(30)
def test_a_rank_lost_after_every_rank_finished_costs_nothing(sup, store):
    c = client(store)
    c.set(keys.finished(0), b"1")
    assert sup.fail(2) is None
    gone = next(m for m in sup.members if m.worker.rank == 2)
    assert gone.state is WorkerState.SUCCEEDED and sup.failures == []  # done, not failed
    assert sup.rendezvous.causes == [] and sup.starts == [] and sup.stops == []  # nothing asked, started, stopped
    assert sup.events == [("lost_after_end", {"rank": 2, "pid": gone.proc.pid, "round": 0, "how": "killed by SIGKILL"})]


@pytest.mark.timeout(30)
def test_a_rank_lost_before_entering_a_pending_round_takes_its_seat_there_free(sup, store):
    rec = pending_round_one(sup)
    c = client(store)
    c.set(keys.entering(1, 0), b"1")  # rank 0 entered round 1; rank 1 had not, when it was lost
    assert sup.fail(1) is None
    assert sup.starts == [(1, 2), (1, 1)]  # in round 1, the pending one: no round more asked, nothing charged
    assert sup.rendezvous.causes == [Cause.FAILURE] and sup.stops == []
    assert rec.pending is not None and rec.pending.ranks == (1, 2)
    assert "in_place_declined" not in sup.kinds()
    c.add(keys.joined(1), NPROC)  # every rank joined round 1: the recovery ends, both ranks named
    c.set(keys.ready(1), b"1")
    event = sup.posted.get(timeout=10)
    assert isinstance(event, Recovered) and event.ok
    rec.on(event)
    assert ("recovered", {"round": 1, "ranks": [1, 2], "seconds": 0.0}) in sup.events


@pytest.mark.timeout(30)
def test_a_recovery_the_workers_finished_after_before_its_wait_was_heard_ends_with_the_group(sup, store):
    """Every rank sets `ready` and finishes at once: the supervisor sees the workers' exits before the round's
    wait is handed to its loop. The group's end says the recovery as any other, timed when the wait ended."""
    rec = pending_round_one(sup)
    c = client(store)
    sup.clock.advance(0.4)
    c.add(keys.joined(1), NPROC)
    c.set(keys.ready(1), b"1")
    heard = sup.posted.get(timeout=10)  # posted, never handed over: the loop ended first
    assert isinstance(heard, Recovered) and heard.ok and heard.at == 100.4
    sup.clock.advance(2.0)
    rec.at_end()
    assert ("recovered", {"round": 1, "ranks": [2], "seconds": 0.4}) in sup.events and rec.pending is None
    rec.on(heard)  # handed over after all: heard once
    assert sup.kinds().count("recovered") == 1


@pytest.mark.timeout(30)
def test_a_group_that_ends_with_nothing_pending_says_no_recovery(sup):
    sup.in_place.at_end()
    assert "recovered" not in sup.kinds()


@pytest.mark.timeout(30)
def test_a_rank_lost_within_a_tenth_of_a_second_after_entering_the_pending_round_is_the_same_fault(sup, store):
    """Two ranks of a node lost 50 ms apart (its GPUs, the OOM killer), the second after it entered the round
    the first one's recovery took: the recovery goes on in place in the round after, charged once in all."""
    pending_round_one(sup)
    client(store).set(keys.entering(1, 1), b"1")
    sup.clock.advance(0.05)
    assert sup.fail(1) is None
    sup.joined()
    assert sup.rendezvous.causes == [Cause.FAILURE, Cause.MEMBERSHIP]  # the second round is not charged
    assert sup.starts == [(1, 2), (2, 1)]  # rank 2's replacement runs on: only rank 1 starts in round 2
    assert sup.in_place.pending.round == 2 and sup.in_place.pending.ranks == (1, 2)
    assert "in_place_declined" not in sup.kinds()


@pytest.mark.timeout(30)
def test_a_fault_during_a_recovery_costs_one_more_restart_or_ends_the_job_when_none_is_left(sup, store):
    pending_round_one(sup)
    client(store).set(keys.entering(1, 1), b"1")
    sup.clock.advance(2.0)
    said = sup.fail(1)
    assert said == (
        "rank 1 killed by SIGKILL while round 1 was recovering in place (after rank 1 entered it): "
        "no restart left (--max_restarts 1): stopping the group"
    )
    assert sup.starts == [(1, 2)] and sup.in_place.pending is None
    declined = [f["reason"] for k, f in sup.events if k == "in_place_declined"]
    assert declined == ["a worker failed while round 1 was recovering in place (after rank 1 entered it)"]


@pytest.mark.timeout(30)
def test_a_replacement_lost_in_its_own_round_is_replaced_in_the_round_after_for_one_more_restart(sup, store):
    sup.config = dataclasses.replace(sup.config, max_restarts=2)
    sup.in_place.config = sup.config
    pending_round_one(sup)
    sup.clock.advance(2.0)
    assert sup.fail(2) is None  # the replacement itself
    sup.joined()
    assert sup.rendezvous.causes == [Cause.FAILURE, Cause.FAILURE]
    assert sup.starts == [(1, 2), (2, 2)] and sup.in_place.pending.ranks == (2,)


@pytest.mark.timeout(30)
def test_a_leave_exit_while_a_round_is_pending_restarts_the_group_free(sup, store):
    pending_round_one(sup)
    assert sup.fail(1, code=keys.LEAVE_EXIT) is None
    assert sup.stops == [(Then.MEMBERSHIP, "restart")]  # a membership round follows: nothing charged
    assert sup.in_place.pending is None and sup.rendezvous.causes == [Cause.FAILURE]
    reason = next(f["reason"] for k, f in sup.events if k == "in_place_declined")
    assert reason == f"rank 1 cannot go on in place (exit {keys.LEAVE_EXIT}) while round 1 recovers in place"


@pytest.mark.timeout(30)
def test_a_leave_exit_while_the_round_is_asked_for_restarts_the_node_in_that_round(sup, store):
    sup.rendezvous.gate.clear()
    assert sup.fail(2) is None  # rank 2 killed: round 1 asked for, not come yet
    assert sup.fail(1, code=keys.LEAVE_EXIT) is None
    assert sup.stops == []  # the round asked for is awaited
    sup.rendezvous.gate.set()
    sup.joined()
    assert sup.starts == [] and sup.held is not None and sup.held[0].round == 1  # restarted in round 1
    assert sup.stops == [(Then.MEMBERSHIP, "restart")] and sup.rendezvous.causes == [Cause.FAILURE]
    assert not client(store).check([keys.opened(1)])  # round 1 never opened in place
    assert [k for k in sup.kinds() if k.startswith("in_place")] == ["in_place_declined"]


@pytest.mark.timeout(30)
def test_a_leave_exit_while_another_node_recovers_restarts_free(sup, store):
    client(store).set(keys.opened(1), b"1")  # round 1 opened by another node's agent
    assert sup.fail(0, code=keys.LEAVE_EXIT) is None
    assert sup.stops == [(Then.MEMBERSHIP, "restart")] and sup.rendezvous.causes == []


@pytest.mark.timeout(30)
def test_a_leave_exit_with_no_recovery_under_way_is_an_ordinary_failure(sup, store):
    assert sup.fail(1, code=keys.LEAVE_EXIT) is None
    sup.joined()
    assert sup.starts == [(1, 1)] and sup.rendezvous.causes == [Cause.FAILURE]  # replaced in place, charged
