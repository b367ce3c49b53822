"""The chaos campaign's in-place shape (scripts/chaos/inplace.py): its invariants as pure functions of
hand-made events files and step logs, one record that breaks each and one that keeps it; and its plan."""

from __future__ import annotations

import argparse
import re
import sys

import pytest
from support.paths import ROOT

sys.path.insert(0, str(ROOT / "scripts"))  # the campaign's package, scripts/chaos/
from chaos import inplace as inv  # noqa: E402
from chaos.campaign import in_place_faults  # noqa: E402
from chaos.faults import IN_PLACE_STRIKES, plan, self_inflicted  # noqa: E402
from chaos.records import (  # noqa: E402
    IN_PLACE_DEFAULT,
    IN_PLACE_FAULTS,
    IN_PLACE_STEP_COUNT,
    JOIN_DELAY,
    SELF_INFLICTED,
    AgentRecord,
    Die,
    Episode,
    Event,
    Fault,
    Shape,
    StepLine,
)

pytestmark = pytest.mark.timeout(30)


def ev(kind: str, at: float, **kw) -> Event:
    return Event(kind, at, **kw)


def spawned(at: float, pids: dict[int, int], rnd: int = 0, restarts: int = 0, in_place: bool = False) -> list[Event]:
    return [ev("spawn", at, rank=r, pid=p, round=rnd) for r, p in pids.items()] + [
        ev("running", at, round=rnd, restarts=restarts, in_place=in_place)
    ]


START = [ev("rendezvous", 0.0, cause="start"), ev("starting", 0.0, round=0, restarts=0), *spawned(1.0, {0: 10, 1: 11})]


def recovered_from_kill(killed: int = 11, rank: int = 1, new: int = 12) -> list[Event]:
    """Rank `rank`'s process `killed` SIGKILLed at 2.0 and replaced in place by `new`."""
    return [
        ev("exit", 2.0, rank=rank, pid=killed, returncode=-9),
        ev("rendezvous", 2.0, cause="in_place"),
        *spawned(2.1, {rank: new}, rnd=1, restarts=1, in_place=True),
        ev("recovered", 2.5, round=1, ranks=(rank,)),
    ]


def ended(at: float, restarts: int, code: int = 0) -> list[Event]:
    return [ev("finished", at, exit_code=code, restarts=restarts)]


def node(events: list[Event], rc: int | None = 0, name: str = "node0", **kw) -> AgentRecord:
    return AgentRecord(name, rc, events=tuple(events), **kw)


def steps(pid: int, rank: int, done: list[int], at: float, start: int | None = None, world: int = 2) -> list[StepLine]:
    """A process's step log: its start line at `at`, then a step line per entry of `done`, 0.1 s apart."""
    first = [StepLine("start", pid, rank, world, 0, done[0] - 1 if start is None else start, at)]
    return first + [StepLine("step", pid, rank, world, 0, n, at + 0.1 * (i + 1)) for i, n in enumerate(done)]


def episode(*struck: int, landed=(Fault.WORKER_KILL,), spare: bool = False) -> Episode:
    return Episode("c10d", 1, Shape.IN_PLACE, landed=list(landed), struck=set(struck), spare=spare)


def test_a_kill_recovered_in_place_keeps_every_invariant():
    agents = [node(START + recovered_from_kill() + ended(9.0, 1))]
    lines = steps(10, 0, [1, 2, 3, 4], 1.0) + steps(11, 1, [1, 2], 1.0) + steps(12, 1, [3, 4], 2.5, start=2)
    assert inv.check(episode(11), agents, lines, world=2, steps=4, cap=3) == []


def test_a_survivor_keeps_its_process():
    # rank 0's process was not struck, yet the events spawn it again and it steps in a new process
    events = START + [ev("exit", 2.0, rank=0, pid=10, returncode=0), *spawned(2.1, {0: 13}, rnd=1, restarts=0)]
    lines = steps(10, 0, [1, 2], 1.0) + steps(13, 0, [3], 2.5)
    assert inv.pids_kept(episode(11), [node(events)], lines, None) == [
        "rank 0: a new process 13 was spawned, but its process 10 was not struck (a survivor)",
        "rank 0: stepped in process 13 after 10, which was not struck (a survivor)",
    ]
    # the struck rank's new process is fine; so is every process after the group was stopped (at 2.0)
    assert inv.pids_kept(episode(10), [node(events)], lines, None) == []
    assert inv.pids_kept(episode(), [node(events)], lines, 2.0) == []


def test_the_group_is_stopped_only_where_the_launcher_must():
    declined = [ev("in_place_declined", 3.0, reason="a worker failed while round 1 was recovering in place")]
    stop = [ev("stopping", 3.0, reason="restart")]
    pending = START + recovered_from_kill()[:-1]  # round 1 under way: no `recovered` yet
    assert inv.group_restarts([node(pending + declined + stop)]) == (3.0, [])
    done = START + recovered_from_kill()  # round 1 recovered: a decline now has no excuse
    assert inv.group_restarts([node(done + declined + stop)])[1] == [
        "node0: restarted the group instead of recovering in place: a worker failed while round 1 was "
        "recovering in place"
    ]
    several = [ev("in_place_declined", 3.0, reason="the job has several nodes")]
    assert inv.group_restarts([node(START + several + stop)])[1] == [
        "node0: restarted the group instead of recovering in place: the job has several nodes"
    ]
    hung = [
        ev("in_place_declined", 3.0, reason="several ranks went silent at once (a hang, and the ranks waiting on it)")
    ]
    assert inv.group_restarts([node(START + hung + stop)]) == (3.0, [])  # a hang: one group restart
    assert inv.group_restarts([node(START + stop)])[1] == [
        "node0: stopped the group (restart) with no in-place recovery declined"
    ]
    failed = [ev("in_place_failed", 9.0, round=1)]
    assert inv.group_restarts([node(pending + failed + stop)])[1] == [
        "node0: the in-place recovery of round 1 did not finish (in_place_failed)"
    ]
    assert inv.group_restarts([node(pending + failed + stop)], hung=True) == (3.0, [])  # a frozen survivor
    assert inv.group_restarts([node(START + [ev("stopping", 3.0, reason="fail")])]) == (3.0, [])
    # a change while the workers it started afresh had not all joined their round: nothing to keep yet
    starting = [ev("in_place_declined", 3.0, reason="round 0's ranks never all joined it holding the state")]
    assert inv.group_restarts([node(START + starting + stop)]) == (3.0, [])
    leave = "rank 0 cannot go on in place (exit 86) while round 1 recovers in place"
    left = [ev("in_place_declined", 3.0, reason=leave)]
    assert inv.group_restarts([node(pending + left + stop)]) == (3.0, [])  # collateral of the fault charged
    other = [ev("in_place_declined", 3.0, reason="another node restarts the group (several ranks went silent)")]
    assert inv.group_restarts([node(done + other + stop)]) == (3.0, [])  # that node's decline is checked on its own
    in_place = [ev("in_place_declined", 3.0, reason="round 1's ranks never all joined it holding the state")]
    assert inv.group_restarts([node(done + in_place + stop)])[1] == [  # round 1 was an in-place one
        "node0: restarted the group instead of recovering in place: "
        "round 1's ranks never all joined it holding the state"
    ]


def test_the_world_size_never_changes():
    assert inv.world_constant(steps(10, 0, [1], 1.0), 2) == []
    assert inv.world_constant(steps(10, 0, [1], 1.0, world=1), 2) == ["the world size changed: [1] beside 2"]


def test_a_rank_goes_back_at_most_the_step_in_flight():
    old = steps(11, 1, [1, 2, 3], 1.0)
    assert inv.steps_forward(old + steps(12, 1, [3, 4], 2.0, start=2), None) == []  # step 3 done again
    assert inv.steps_forward(old + steps(12, 1, [2, 3], 2.0, start=1), None) == [
        "rank 1: went back from step 3 to 1 (process 12)"
    ]
    assert inv.steps_forward(old + steps(12, 1, [2, 3], 2.0, start=1), 2.0) == []  # the group was restarted
    twice = old + [StepLine("step", 11, 1, 2, 1, 3, 1.5)]
    assert inv.steps_forward(twice, None) == ["rank 1: process 11 did step 3 twice"]


def test_a_job_that_succeeded_did_every_step():
    lines = steps(10, 0, [1, 2], 1.0) + steps(11, 1, [1], 1.0)
    assert inv.all_steps_done([node([])], lines, 2) == ["the job succeeded but ranks stopped short of step 2: {1: 1}"]
    assert inv.all_steps_done([node([], rc=1)], lines, 2) == []


def test_one_verdict_per_agent_and_the_same_for_all():
    assert inv.one_verdict([node(ended(9.0, 0)), node(ended(9.0, 0), name="node1")]) == []
    assert inv.one_verdict([node(ended(9.0, 0) + ended(9.1, 0))]) == ["node0: 2 verdicts (finished events), not one"]
    assert inv.one_verdict([node(ended(9.0, 1, code=1))]) == ["node0: its verdict says exit 1 but it exited 0"]
    assert inv.one_verdict([node(ended(9.0, 0)), node(ended(9.0, 0, code=1), rc=1, name="node1")]) == [
        "the agents' verdicts differ: {'node0': 0, 'node1': 1}"
    ]
    assert inv.one_verdict([node([], rc=-9, killed=True), node([], rc=None, name="node1")]) == []


def test_the_budget_matches_the_events():
    assert inv.budget(episode(11), [node(START + recovered_from_kill() + ended(9.0, 1))], cap=3) == []
    assert inv.budget(episode(11), [node(START + recovered_from_kill() + ended(9.0, 2))], cap=3) == [
        "node0: its verdict counts 2 restart(s), its rounds 1"
    ]
    assert inv.budget(episode(11), [node(START + recovered_from_kill() + ended(9.0, 1))], cap=0) == [
        "node0: 1 restarts charged, past --max_restarts 0"
    ]
    # no worker failed (a freeze), yet a restart was charged
    jumped = START + [*spawned(2.1, {1: 12}, rnd=1, restarts=1, in_place=True)]
    assert inv.budget(episode(landed=(Fault.WORKER_FREEZE,)), [node(jumped)], cap=3) == [
        "node0: 1 restart(s) charged, but 0 worker(s) failed",
        "node0: 1 restart(s) charged, but 0 worker(s) killed",
    ]
    wrong = START + recovered_from_kill()[:-1] + [ev("recovered", 2.5, round=1, ranks=(0,))]
    assert inv.budget(episode(11), [node(wrong)], cap=3) == ["node0: round 1 recovered ranks [0], but [1] failed"]
    skipped = START + [*spawned(2.1, {1: 12}, rnd=1, restarts=2, in_place=True)]
    assert "node0: round 1 charged 2 restart(s) after 0" in inv.budget(episode(11, 12), [node(skipped)], cap=3)


def test_the_shape_plans_from_its_own_fault_kinds():
    assert set(IN_PLACE_STRIKES) == set(IN_PLACE_FAULTS)
    skip = set(IN_PLACE_FAULTS) - {Fault.WORKER_KILL, Fault.WORKER_FREEZE}
    ep = plan("c10d", 1010, skip, Shape.IN_PLACE)
    assert {f for _, f in ep.faults} <= {Fault.WORKER_KILL, Fault.WORKER_FREEZE} and not ep.spare
    assert all(0.0 <= at <= 2.5 for at, _ in ep.faults)
    assert plan("c10d", 1010, {Fault.WORKER_HANG}, Shape.IN_PLACE).spare  # agent-kill asked for: a spare
    assert not ep.dies and not ep.join_delay


def test_a_member_lost_with_a_spare_keeps_the_other_members_processes():
    # node0 (ranks 0, 1: pids 10, 11) SIGKILLed; the spare node2 takes ranks 0 and 1 in round 1, in place;
    # node1's ranks 2 and 3 (pids 20, 21) keep their processes
    ep = episode(10, 11, landed=(Fault.AGENT_KILL,), spare=True)
    survivor = [*spawned(1.0, {2: 20, 3: 21}), ev("rendezvous", 2.0, cause="in_place")]
    survivor += [ev("running", 2.2, round=1, restarts=1, in_place=True), ev("recovered", 2.5, round=1, ranks=(0, 1))]
    spare = [*spawned(2.2, {0: 30, 1: 31}, rnd=1, restarts=1, in_place=True)]
    agents = [
        node(START, rc=-9, killed=True),
        node(survivor + ended(9.0, 1), name="node1"),
        node(spare + ended(9.0, 1), name="node2"),
    ]
    lines = steps(10, 0, [1, 2], 1.0) + steps(20, 2, [1, 2, 3], 1.0) + steps(30, 0, [3], 2.5, start=2)
    assert inv.check(ep, agents, lines, world=2, steps=3, cap=3) == []
    # what the launcher does today: the group restarts, node1's workers too (what follows a stop is its own)
    respawned = [*spawned(1.0, {2: 20}), ev("stopping", 2.0, reason="membership"), *spawned(3.0, {2: 22})]
    assert inv.check(ep, [node(respawned + ended(9.0, 0))], lines, world=2, steps=3, cap=3) == [
        "node0: stopped the group (membership) with no in-place recovery declined"
    ]


NEW = {Fault.AFTER_COMMIT, Fault.STARTUP, Fault.TEARDOWN, Fault.TWO_RANKS, Fault.RECOVERY_FAULT}


def test_the_exact_kinds_are_drawn_with_the_others_by_default():
    assert NEW <= set(IN_PLACE_DEFAULT) and set(IN_PLACE_DEFAULT) == set(IN_PLACE_FAULTS)
    assert in_place_faults("after-commit,two-ranks") == (Fault.AFTER_COMMIT, Fault.TWO_RANKS)
    with pytest.raises(argparse.ArgumentTypeError, match="before-commit: not an in-place fault"):
        in_place_faults("before-commit")


@pytest.mark.parametrize(
    "seed,faults,dies,join_delay",
    [
        (
            20,
            [(0.65, Fault.STARTUP), (2.18, Fault.AFTER_COMMIT)],
            [Die(2, 0, "startup"), Die(2, 22, "after-commit")],
            0,
        ),
        (21, [(1.724, Fault.TWO_RANKS)], [], 0.0),
        (26, [(1.36, Fault.RECOVERY_FAULT), (1.649, Fault.STARTUP)], [Die(1, 0, "startup")], JOIN_DELAY),
        (27, [(0.491, Fault.TEARDOWN), (1.753, Fault.TWO_RANKS)], [Die(0, 0, "teardown")], 0.0),
    ],
)
def test_a_seed_plans_the_same_self_inflicted_deaths(seed, faults, dies, join_delay):
    ep = plan("c10d", seed, set(IN_PLACE_FAULTS) - NEW, Shape.IN_PLACE)
    assert (ep.faults, ep.dies, ep.join_delay, ep.spare) == (faults, dies, join_delay, False)


def test_self_inflicted_deaths_are_drawn_in_the_job():
    for seed in range(200):
        ep = plan("etcd", seed, set(IN_PLACE_FAULTS) - NEW - {Fault.AGENT_KILL}, Shape.IN_PLACE)
        world = 4 if ep.spare else 3
        assert sorted(d.phase for d in ep.dies) == sorted(f.value for _, f in ep.faults if f in SELF_INFLICTED)
        for d in ep.dies:
            assert 0 <= d.rank < world and d.delay == 0.0
            assert 1 <= d.step <= IN_PLACE_STEP_COUNT - 2 if d.phase == "after-commit" else d.step == 0
        assert (ep.join_delay > 0) == any(f is Fault.RECOVERY_FAULT for _, f in ep.faults)
    assert Die(1, 7, "after-commit", 0.05).entry() == "1 7 after-commit 0.05"  # the worker's DIE_AT entry


def test_the_step_log_reads_every_kind_of_line():
    assert StepLine.parse("step 10 1 3 0 5 1.5 0.25") == StepLine("step", 10, 1, 3, 0, 5, 1.5, loss=0.25)
    assert StepLine.parse("step 10 1 3 0 5 1.5") == StepLine("step", 10, 1, 3, 0, 5, 1.5)
    assert StepLine.parse("applied 10 1 3 0 4 1.5") == StepLine("applied", 10, 1, 3, 0, 4, 1.5)
    assert StepLine.parse("die 10 1 3 0 0 1.5 startup") == StepLine("die", 10, 1, 3, 0, 0, 1.5, phase="startup")
    final = StepLine.parse("final 10 1 3 1 100 9.5 40 100 ab12")
    assert final == StepLine("final", 10, 1, 3, 1, 100, 9.5, applied=40, lineage=100, digest="ab12")
    assert StepLine.parse("final 10 1 3 1 100 9.5 40") is None  # cut short
    assert StepLine.parse("die 10 1 3 0 0") is None and StepLine.parse("loss 10 1 3 0 0 1.5") is None


def test_the_deaths_that_landed_are_the_die_lines():
    ep = episode()
    lines = [
        StepLine("die", 21, 2, 3, 0, 100, 9.0, phase="teardown"),
        StepLine("die", 20, 1, 3, 0, 0, 1.0, phase="startup"),
    ]
    self_inflicted(ep, [*steps(10, 0, [1], 1.0), *lines])
    assert ep.landed == [Fault.WORKER_KILL, Fault.STARTUP, Fault.TEARDOWN] and ep.struck == {20, 21}
    assert ep.done == [
        "rank 1 (pid 20) SIGKILLed itself at startup (0 steps done)",
        "rank 2 (pid 21) SIGKILLed itself at teardown (100 steps done)",
    ]
    assert [what for what, _ in ep.expect] == ["the startup death", "the teardown death"]
    assert re.search(ep.expect[0][1], "launcher: rank 1 killed by SIGKILL; recovering in place")
