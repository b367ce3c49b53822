"""The chaos campaign's exactness invariants (scripts/chaos/exact.py) as pure functions of hand-made step
logs and events files, one record that breaks each and one that keeps it; and the reference's cache."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.paths import ROOT

sys.path.insert(0, str(ROOT / "scripts"))  # the campaign's package, scripts/chaos/
from chaos import exact  # noqa: E402
from chaos.records import AgentRecord, Episode, Event, Fault, Shape, StepLine  # noqa: E402
from chaos.reference import Reference, key, reference  # noqa: E402

pytestmark = pytest.mark.timeout(30)

REF = Reference(world=2, steps=3, seed=0, digests=("aa", "bb"), path=Path("reference.json"))


def line(kind: str, pid: int, rank: int, step: int, at: float, **kw) -> StepLine:
    return StepLine(kind, pid, rank, 2, 0, step, at, **kw)


def ran(pid: int, rank: int, indices: list[int], at: float) -> list[StepLine]:
    """A process that applied and finished steps `indices`, 0.1 s apart from `at`."""
    out = []
    for i, n in enumerate(indices):
        out += [line("applied", pid, rank, n, at + 0.1 * i), line("step", pid, rank, n + 1, at + 0.1 * i + 0.05)]
    return out


def final(pid: int, rank: int, at: float = 9.0, step: int = 3, lineage: int = 3, digest: str | None = None):
    return line("final", pid, rank, step, at, applied=3, lineage=lineage, digest=digest or REF.digests[rank])


def node(events: list[Event] = (), rc: int | None = 0, **kw) -> AgentRecord:
    return AgentRecord("node0", rc, events=tuple(events), **kw)


def episode(*landed: Fault) -> Episode:
    return Episode("c10d", 1, Shape.IN_PLACE, landed=list(landed))


def charged(n: int) -> list[Event]:
    return [Event("running", 1.0, round=0, restarts=0), Event("running", 2.0, round=1, restarts=n)]


def test_an_exact_job_keeps_every_invariant():
    lines = ran(10, 0, [0, 1, 2], 1.0) + ran(11, 1, [0, 1, 2], 1.0) + [final(10, 0), final(11, 1)]
    assert exact.check(episode(), [node()], lines, REF) == []


def test_every_rank_ends_with_the_undisturbed_weights_and_each_step_applied_once():
    good = [final(10, 0), final(11, 1)]
    assert exact.final_weights([node()], good, REF) == []
    assert exact.final_weights([node()], [final(10, 0)], REF) == ["ranks [1]: no process reported its final weights"]
    twice = [final(10, 0, lineage=4, digest="cc"), final(12, 1, step=2)]
    assert exact.final_weights([node()], twice, REF) == [
        "ended short of step 3 (rank/process: steps): {'1/12': 2}",
        "a state applied other than 3 optimizer steps along its lineage: {'0/10': 4}",
        "final weights not the undisturbed run's (rank/process sha256): 0/10 cc",
    ]


def test_a_job_that_failed_is_a_violation_and_one_still_running_is_said_elsewhere():
    assert exact.final_weights([node(rc=1)], [], REF) == [
        "the job did not succeed (exits {'node0': 1}): its final weights were never compared"
    ]
    assert exact.final_weights([node(rc=None)], [], REF) == []
    assert exact.final_weights([node(rc=-9, killed=True), node()], [final(10, 0), final(11, 1)], REF) == []


def test_no_process_applies_a_step_twice():
    redone = ran(10, 0, [0, 1], 1.0) + ran(10, 0, [1, 2], 2.0)  # after-commit: the step in flight again
    assert exact.applied_once(redone) == ["rank 0: process 10 applied step 1's optimizer step 2 times"]
    replaced = ran(10, 0, [0, 1], 1.0) + ran(12, 0, [1, 2], 2.0)  # another process: the lineage's count says
    assert exact.applied_once(replaced) == []


@pytest.mark.parametrize(
    "landed,n,said",
    [
        ((Fault.TEARDOWN,), 2, "2 restart(s) charged for teardown (1): at most 1"),
        ((Fault.TWO_RANKS,), 2, "2 restart(s) charged for two-ranks (1): at most 1"),
        ((Fault.RECOVERY_FAULT,), 2, None),
        ((Fault.RECOVERY_FAULT,), 3, "3 restart(s) charged for recovery-fault (2): at most 2"),
        ((Fault.STARTUP, Fault.AFTER_COMMIT), 2, None),
        ((Fault.WORKER_FREEZE,), 1, "1 restart(s) charged for worker-freeze (0): at most 0"),
        ((), 1, "1 restart(s) charged for no fault: at most 0"),
    ],
)
def test_the_restarts_charged_stay_within_the_faults_costs(landed, n, said):
    assert exact.charges(episode(*landed), [node(charged(n))]) == ([said] if said else [])


def test_a_startup_death_costs_no_wait():
    died = [line("die", 12, 1, 0, 1.0, phase="startup")]
    quick = died + ran(10, 0, [0], 3.0)
    assert exact.startup_quick([node()], quick) == []
    slow = died + ran(10, 0, [0], 1.0 + exact.STARTUP_WAIT + 1)
    assert exact.startup_quick([node()], slow) == [
        f"rank 1 died at startup and the job's first step came {exact.STARTUP_WAIT + 1.05:.1f} s later "
        f"(at most {exact.STARTUP_WAIT:g})"
    ]
    failed = [Event("in_place_failed", 61.0, round=1)]
    assert exact.startup_quick([node(failed)], quick) == [
        "rank 1 died at startup and round 1 waited out --in_place_timeout"
    ]


def test_a_teardown_death_runs_no_step_again():
    died = line("die", 11, 1, 3, 5.0, phase="teardown")
    # rank 0 finishes its last step after rank 1 died: not again
    lines = ran(10, 0, [0, 1], 1.0) + ran(10, 0, [2], 5.1) + ran(11, 1, [0, 1, 2], 1.0) + [died]
    assert exact.teardown_free(lines) == []
    again = lines + ran(10, 0, [2], 6.0) + ran(13, 1, [2], 6.0)  # a survivor and a replacement redo step 2
    assert exact.teardown_free(again) == [
        "rank 1 died at teardown and 2 step(s) ran again after it, (rank, index) [(0, 2), (1, 2)]"
    ]


def test_the_reference_is_read_from_the_campaigns_folder(tmp_path):
    cached = tmp_path / f"reference-w2-n3-s7-{key()}.json"
    cached.write_text(json.dumps({"world": 2, "steps": 3, "seed": 7, "digests": ["aa", "bb"]}))
    ref = reference(tmp_path, 2, 3, 7)  # cached: no run
    assert ref == Reference(2, 3, 7, ("aa", "bb"), cached, cached=True)
    assert ref.describe() == f"reference weights for world 2, 3 steps, seed 7: rank 0 aa... (cached in {cached})"
