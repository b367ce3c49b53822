"""The invariants: pure checks of an episode's record (its faults, what each agent left), each giving its violations."""

from __future__ import annotations

import json
import re

from .records import (
    FOR_GOOD,
    LINK_FAULTS,
    LIVENESS,
    QUARANTINES,
    REFORM_S,
    RIDDEN_OUT,
    STOP_S,
    STOPS_A_NODE,
    AgentRecord,
    Episode,
    Fault,
    Shape,
    Start,
)

DISTURBED = re.compile(
    r"membership changed|a node was lost: |restarting|reason: |exited with|killed by|rendezvous store|hung: no progress"
)
STORE_LOST = re.compile(r"reason: .*(?:rendezvous store|etcd at)")  # a node cut off for good says what it lost
CUT_REASON = re.compile(rf"{STORE_LOST.pattern}|reason: .*the job was closed")  # back in time, it may find the job over
QUARANTINED = re.compile(r"reason: \S+ is quarantined: ")  # its own failure, told before the cut's (exit 69)
STEP_LINE = re.compile(r"\[rank(\d+)\]: (start|step) rank=\d+ (?:world=\S+ restart=\S+ round=\S+ from=(\d+)|n=(\d+))")
# A worker's own line on its agent's stderr: in place, a newcomer whose source is killed mid-transfer
# dies with its traceback (and the agent restarts the group); that traceback is the script's, not the agent's.
WORKER_LINE = re.compile(r"\[(?:\S+ )?rank\d+\]: ")  # "[rank2]: ", or across nodes "[host rank2]: "
Rounds = dict[str, list[Start]]  # round -> the starts of its workers, every agent's


def check(ep: Episode, agents: list[AgentRecord], checkpoint: str | None) -> list[str]:
    """Every invariant of the episode `ep` whose agents left `agents` (the spare last) and whose checkpoint
    file held `checkpoint` (None: none written); the violations, in the order they are reported."""
    live = [a for a in agents if not a.killed]
    cut = cut_reasons(ep)
    by_round = rounds(agents)
    v = ended_clearly(live, cut) + no_orphans(agents) + rounds_agree(by_round)
    if ep.shape is Shape.IN_PLACE:  # the rest: scripts/chaos/inplace.py, on the events files and step logs
        return v + causes_named(ep, live, cut) + fault_named(ep, live, cut)
    if ep.shape is Shape.SPARES:
        v += spares_budget(ep, by_round) + spares(ep, agents, by_round)
    else:
        v += budget(ep, by_round)
    v += ridden_out(ep, agents, by_round) + causes_named(ep, live, cut) + fault_named(ep, live, cut)
    v += cut_nodes(ep, agents) + checkpoint_whole(checkpoint) + no_line_lost(live)
    return v


def cut_reasons(ep: Episode) -> dict[str, re.Pattern]:
    """Each cut node -> what its reason must name if it gives up (the store; or, back in time, the job's close)."""
    return {name: STORE_LOST if length == FOR_GOOD else CUT_REASON for name, _, length in ep.cuts}


def rounds(agents: list[AgentRecord]) -> Rounds:
    """The workers' starts by round."""
    by_round: Rounds = {}
    for a in agents:
        for s in a.starts():
            by_round.setdefault(s.round, []).append(s)
    return by_round


def ended_clearly(live: list[AgentRecord], cut: dict[str, re.Pattern]) -> list[str]:
    """Every live node finished, or ended with a clear reason (a cut one naming what it lost), within the
    bound, and printed no traceback of its own (a worker's, prefixed with its rank, is the script's)."""
    v = []
    for a in live:
        text = "\n".join(a.err)
        if a.rc is None:
            v.append(f"{a.name} still running after the bound")
        elif any("Traceback" in line and not WORKER_LINE.match(line) for line in a.err):
            v.append(f"{a.name}: a Python traceback on the agent's stderr")
        elif a.rc != 0 and not re.search(r"reason: |error: ", text):
            v.append(f"{a.name}: exit {a.rc} with no reason given")
        elif (
            a.rc != 0
            and a.name in cut
            and not cut[a.name].search(text)
            and not (a.rc == 69 and QUARANTINED.search(text))
        ):
            v.append(
                f"{a.name}: its link was cut and it gave up, but its reason does not name what it lost: "
                f"{[line for line in a.err if 'reason: ' in line]}"
            )
    return v


def no_orphans(agents: list[AgentRecord]) -> list[str]:
    """An agent that ended left nothing behind: it and everything it started are gone."""
    return [
        f"{a.name}: processes left after its agent ended: {list(a.left)}" for a in agents if a.rc is not None and a.left
    ]


def rounds_agree(by_round: Rounds) -> list[str]:
    """Every node of a round agrees on its world size and restart count; no rank runs twice in a round."""
    v = []
    for rnd, seen in sorted(by_round.items()):
        if len({s.world for s in seen}) != 1 or len({s.restart for s in seen}) != 1:
            v.append(f"round {rnd}: nodes disagree: {sorted({(s.agent, s.world, s.restart) for s in seen})}")
        ranks = [s.rank for s in seen]
        if len(ranks) != len(set(ranks)):
            v.append(f"round {rnd}: a rank ran twice: {sorted(ranks)}")
    return v


def restarts(by_round: Rounds) -> int:
    """The most restarts charged to the budget, by the workers' restart counts."""
    return max((int(s.restart) for seen in by_round.values() for s in seen), default=0)


def budget(ep: Episode, by_round: Rounds) -> list[str]:
    """Elastic: only a failed worker is charged to the restart budget."""
    charged, killed = restarts(by_round), ep.landed.count(Fault.WORKER_KILL)
    return [f"{charged} restart(s) charged, but {killed} worker(s) killed"] if charged > killed else []


def spares_budget(ep: Episode, by_round: Rounds) -> list[str]:
    """Fixed size: a lost member is charged too (below MIN), once per loss."""
    charged, killed = restarts(by_round), ep.landed.count(Fault.WORKER_KILL)
    lost = sum(f in STOPS_A_NODE for f in ep.landed)
    if charged > killed + lost:
        return [f"{charged} restart(s) charged, but {killed} worker(s) killed and {lost} node(s) stopped"]
    return []


def spares(ep: Episode, agents: list[AgentRecord], by_round: Rounds) -> list[str]:
    """A fixed-size job with a spare: the world never changes; a quarantined node exits 69 and runs no worker
    again; a member lost while the spare is untouched is replaced by it; every node left untouched ends with
    the job's verdict, the spare included."""
    v, spare = [], agents[-1]
    worlds = {s.world for seen in by_round.values() for s in seen}
    if worlds - {"4"}:
        v.append(f"a fixed-size job of 2 x 2 workers ran at world size {sorted(worlds)}")
    touched = set(ep.victims) | ep.frozen | {name for name, _, _ in ep.cuts}
    # Surely lost: killed, or cut past the liveness timeout (a freeze of 2.5-4 s may or may not outlast it).
    long_cuts = {name for name, _, length in ep.cuts if length >= LIVENESS + 2.0}
    quarantined: dict[str, float] = {}  # node -> when it said it is quarantined (and leaves, exit 69)
    for a in agents:
        mark = f"launcher: {a.name} is quarantined: "
        at = next((t for line, t in zip(a.err, a.err_at) if mark in line), None)
        if at is None:
            continue
        quarantined[a.name] = at
        if a.rc not in (69, None) and not a.killed:
            v.append(f"{a.name} was quarantined but exited {a.rc}, not 69")
        late = [s for s in a.starts() if s.at > at]
        if late:
            v.append(f"{a.name} was quarantined but ran workers again: {late[0]}")
    members_lost = [
        name
        for name, fault in zip(ep.victims, ep.landed)
        if name != spare.name
        and (fault is Fault.AGENT_KILL or (fault in LINK_FAULTS and name in long_cuts) or name in quarantined)
    ]
    if members_lost and spare.name not in touched and len(ep.landed) == 1 and not spare.starts():
        v.append(f"{members_lost[0]} was lost and the spare stood by, but the spare never ran workers")
    untouched = {a.name: a.rc for a in agents if a.name not in touched and not a.killed}
    if len(set(untouched.values())) > 1:
        v.append(f"the nodes left untouched end with different verdicts: {untouched}")
    return v


def ridden_out(ep: Episode, agents: list[AgentRecord], by_round: Rounds) -> list[str]:
    """An etcd member or leader lost, or the log disk full, alone: as if nothing happened (one round, every
    node finishes)."""
    if ep.landed and all(f in RIDDEN_OUT for f in ep.landed):
        if len(by_round) != 1 or any(a.rc != 0 for a in agents):
            exits = {a.name: a.rc for a in agents}
            return [f"{'; '.join(ep.done)}: not ridden out: rounds {sorted(by_round)}, exits {exits}"]
    return []


def expected(ep: Episode) -> str:
    """A regex of every cause the injected faults may be named by (matches nothing when none landed)."""
    return "|".join(f"(?:{rx})" for _, rx in ep.expect) or r"(?!)"


def causes_named(ep: Episode, live: list[AgentRecord], cut: dict[str, re.Pattern]) -> list[str]:
    """The true cause named: what first disturbed each survivor is one of the injected faults."""
    v, causes = [], expected(ep)
    for a in live:
        if a.name in ep.frozen or a.name in cut:
            continue  # it missed the change it wakes to, or gave up on the store it lost; the others name why
        first = next((line for line in a.err if DISTURBED.search(line)), None)
        if first is not None and not re.search(causes, first):
            v.append(f"{a.name} named a cause that was not injected: {first!r} (injected: {'; '.join(ep.done)})")
    return v


def fault_named(ep: Episode, live: list[AgentRecord], cut: dict[str, re.Pattern]) -> list[str]:
    """One fault: a survivor that was disturbed names it (two faults: one may hide the other). A frozen or
    cut node speaks of what it lost; a spare's loss disturbs nobody."""
    said = [
        line for a in live if a.name not in ep.frozen and a.name not in cut for line in a.err if DISTURBED.search(line)
    ]
    causes = expected(ep)
    if said and len(ep.expect) == 1 and not any(re.search(causes, line) for line in said):
        return [f"no survivor named {ep.expect[0][0]}; they said: {said[:3]}"]
    return []


def cut_nodes(ep: Episode, agents: list[AgentRecord]) -> list[str]:
    """A node whose link is down for good stops its workers within STOP_S of the cut (its last worker
    line). A link cut past the liveness timeout, the episode's only fault that stops a node: each other
    node runs a round without the cut one, or has finished, within the liveness timeout + REFORM_S."""
    v = []
    for name, at, length in ep.cuts:
        a = next(a for a in agents if a.name == name)
        last = a.out_at[-1] if a.out_at and not a.killed else None
        if length == FOR_GOOD and last is not None and last > at + STOP_S:
            v.append(
                f"{name}: cut off for good, its workers still ran {last - at:.0f} s after the cut "
                f"(at most {STOP_S:g} s)"
            )
    stops = STOPS_A_NODE | (QUARANTINES if ep.shape is Shape.SPARES else set())
    if len(ep.cuts) != 1 or sum(f in stops for f in ep.landed) != 1:
        return v
    name, at, length = ep.cuts[0]
    if length < LIVENESS + 2.0:  # shorter: heartbeats late by TCP's backoff may or may not drop it
        return v
    if not any(s.at < at for a in agents if a.name == name for s in a.starts()):
        return v  # a spare that ran no workers yet: its loss ends no round
    by = at + LIVENESS + REFORM_S
    rounds_of_cut = {s.round for a in agents if a.name == name for s in a.starts()}
    for a in agents:
        if a.name == name:
            continue
        reformed = any(at < s.at <= by and s.round not in rounds_of_cut for s in a.starts())
        finished = a.rc == 0 and a.ended_at is not None and a.ended_at <= by
        if not (reformed or finished):
            v.append(
                f"{a.name}: neither re-formed without {name} nor finished within {LIVENESS:g} + {REFORM_S:g} s "
                f"of its link's cut ({length:.1f} s)"
            )
    return v


def checkpoint_whole(checkpoint: str | None) -> list[str]:
    """The checkpoint, if one was written, is whole JSON."""
    if checkpoint is None:
        return []
    try:
        json.loads(checkpoint)
    except ValueError as e:
        return [f"checkpoint not whole: {e}"]
    return []


def no_line_lost(live: list[AgentRecord]) -> list[str]:
    """On a node that finished, each rank's step lines follow on from its start line without a gap."""
    v = []
    for a in live:
        if a.rc != 0:
            continue
        last: dict[str, int] = {}
        for line in a.out:
            m = STEP_LINE.search(line)
            if not m:
                continue
            rank, kind = m.group(1), m.group(2)
            if kind == "start":
                last[rank] = int(m.group(3))
            elif rank in last:
                n = int(m.group(4))
                if n != last[rank] + 1:
                    v.append(f"{a.name}: rank {rank} printed step {n} after step {last[rank]}: a line was lost")
                last[rank] = n
    return v
