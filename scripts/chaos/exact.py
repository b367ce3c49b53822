"""The in-place shape's exactness invariants: pure checks of its workers' step logs and agents' events files
against the undisturbed run's final weights (scripts/chaos/reference.py).

- the job succeeded, and every rank's final process ends at the job's last step with the undisturbed
  run's weights (sha256 of its state_dict), its state having applied each step's optimizer step once
  (Adam's count, passed on with the state along the rank's lineage of processes);
- no process applies a step's optimizer step twice;
- the restarts charged stay within what the faults that landed may cost (records.CHARGES);
- a startup death never waits out --in_place_timeout: the job steps within STARTUP_WAIT s of it;
- a teardown death runs no step again.
"""

from __future__ import annotations

from collections import Counter

from .records import CHARGES, IN_PLACE_TIMEOUT, AgentRecord, Episode, Fault, StepLine
from .reference import Reference

STARTUP_WAIT = IN_PLACE_TIMEOUT / 3  # s from a startup death to the job's first step, at most
RAN = ("applied", "step")  # the lines that say a step ran (an optimizer step applied; a step done)


def check(ep: Episode, agents: list[AgentRecord], lines: list[StepLine], ref: Reference) -> list[str]:
    """Every exactness invariant of the episode `ep` (whose agents left `agents`, whose workers logged
    `lines`, all of them), against the reference `ref`; the violations."""
    # two members' agents lost with one spare standing by: no node is left to take the second's seat
    beyond = ep.landed.count(Fault.AGENT_KILL) > 1
    v = ([] if beyond else final_weights(agents, lines, ref)) + applied_once(lines) + charges(ep, agents)
    return v + startup_quick(agents, lines) + teardown_free(lines)


def final_weights(agents: list[AgentRecord], lines: list[StepLine], ref: Reference) -> list[str]:
    """A job that ended: it succeeded, and each rank's "final" lines say the last step, every optimizer
    step applied once along the lineage, and the undisturbed run's weights."""
    if any(a.rc is None for a in agents if not a.killed):
        return []  # still running after the bound: said already
    failed = {a.name: a.rc for a in agents if not a.killed and a.rc != 0}
    if failed:
        return [f"the job did not succeed (exits {failed}): its final weights were never compared"]
    v: list[str] = []
    finals = sorted((x for x in lines if x.kind == "final"), key=lambda x: (x.rank, x.at))
    missing = sorted(set(range(ref.world)) - {x.rank for x in finals})
    if missing:
        v.append(f"ranks {missing}: no process reported its final weights")
    short = {f"{x.rank}/{x.pid}": x.step for x in finals if x.step != ref.steps}
    if short:
        v.append(f"ended short of step {ref.steps} (rank/process: steps): {short}")
    lineage = {f"{x.rank}/{x.pid}": x.lineage for x in finals if x.lineage != ref.steps}
    if lineage:
        v.append(f"a state applied other than {ref.steps} optimizer steps along its lineage: {lineage}")
    differ = [x for x in finals if x.rank < len(ref.digests) and x.digest != ref.digests[x.rank]]
    if differ:
        who = ", ".join(f"{x.rank}/{x.pid} {x.digest[:10]}" for x in differ)
        v.append(f"final weights not the undisturbed run's (rank/process sha256): {who}")
    return v


def applied_once(lines: list[StepLine]) -> list[str]:
    """No process ran a step's optimizer step twice (its "applied" lines)."""
    counts = Counter((x.rank, x.pid, x.step) for x in lines if x.kind == "applied")
    return [
        f"rank {rank}: process {pid} applied step {step}'s optimizer step {n} times"
        for (rank, pid, step), n in sorted(counts.items())
        if n > 1
    ]


def charged(agents: list[AgentRecord]) -> int:
    """The restarts charged to the job, by the agents' events."""
    return max((e.restarts for a in agents for e in a.events if e.restarts is not None), default=0)


def charges(ep: Episode, agents: list[AgentRecord]) -> list[str]:
    """The restarts charged stay within the faults' costs: a teardown death one (no step again), two ranks
    at once one, a second fault during a recovery one more."""
    n, allowed = charged(agents), sum(CHARGES[f] for f in ep.landed)
    if n <= allowed:
        return []
    kinds = ", ".join(f"{f.value} ({CHARGES[f]})" for f in ep.landed) or "no fault"
    return [f"{n} restart(s) charged for {kinds}: at most {allowed}"]


def startup_quick(agents: list[AgentRecord], lines: list[StepLine]) -> list[str]:
    """A worker lost at startup costs a restart, not a wait: no in-place round ran out of time, and the job
    stepped within STARTUP_WAIT s of the death."""
    v: list[str] = []
    for d in (x for x in lines if x.kind == "die" and x.phase == Fault.STARTUP.value):
        failed = [e for a in agents for e in a.events if e.kind == "in_place_failed"]
        if failed:
            v.append(f"rank {d.rank} died at startup and round {failed[0].round} waited out --in_place_timeout")
        after = [x.at for x in lines if x.kind == "step" and x.at > d.at]
        if after and min(after) - d.at > STARTUP_WAIT:
            v.append(
                f"rank {d.rank} died at startup and the job's first step came {min(after) - d.at:.1f} s later "
                f"(at most {STARTUP_WAIT:g})"
            )
    return v


def teardown_free(lines: list[StepLine]) -> list[str]:
    """A worker lost after the last step (its "final" line written) makes no step run again: after it, the
    lost rank runs none, and the others none twice (they may still be finishing the last)."""
    v: list[str] = []
    ran = Counter((x.rank, x.kind, index(x)) for x in lines if x.kind in RAN)
    for d in (x for x in lines if x.kind == "die" and x.phase == Fault.TEARDOWN.value):
        again = sorted(
            {
                (x.rank, index(x))
                for x in lines
                if x.kind in RAN and x.at > d.at and (x.rank == d.rank or ran[x.rank, x.kind, index(x)] > 1)
            }
        )
        if again:
            v.append(
                f"rank {d.rank} died at teardown and {len(again)} step(s) ran again after it, "
                f"(rank, index) {again[:4]}{' ...' if len(again) > 4 else ''}"
            )
    return v


def index(x: StepLine) -> int:
    """The index of the step a "step" or "applied" line is about (a "step" line counts the steps done)."""
    return x.step - 1 if x.kind == "step" else x.step
