"""The in-place shape's invariants (issue 33): pure checks of its agents' events files and its workers'
step logs, beside the campaign's common ones.

- survivors keep their processes: a rank's pid changes only where a fault ended its process (a worker
  killed or hung, its node lost); no group stopped, unless the launcher says it must (a worker failed
  while a recovery was under way);
- the world size never changes;
- a rank's step never goes back more than one (the step in flight), and one process never does a
  step twice;
- each live agent ends with one verdict, the same for all;
- the restarts charged match the events: one per round a failure opened, within --max_restarts, no
  more than the failures, and each `recovered` names the ranks that failed.
"""

from __future__ import annotations

from dataclasses import replace

from .records import AgentRecord, Episode, Fault, StepLine

RECOVERING = "recovering in place"  # in_place_declined's reason when a worker failed during a recovery
HUNG = "went silent at once"  # in_place_declined's reason for a hang (its peers, waiting on it, are silent too)
STORE_LOST = "(group rank 0) was lost or restarted"  # ... when the node serving the workers' store was lost with it
REJOIN_EXIT = 87  # launcher.worker.inplace.keys.REJOIN_EXIT
NOT_WHOLE = "never all joined it holding the state"  # ... when the round's workers had not all started yet
FOLLOWED = "another node restarts the group"  # ... when another node declined (its decline is checked on its own)
LEFT = "cannot go on in place"  # ... when a worker exited keys.LEAVE_EXIT while a recovery was under way


def check(ep: Episode, agents: list[AgentRecord], lines: list[StepLine], world: int, steps: int, cap: int) -> list[str]:
    """Every in-place invariant of the episode `ep` (whose agents left `agents`, whose workers logged `lines`,
    a job of `world` ranks and `steps` steps under --max_restarts `cap`); the violations."""
    hung = Fault.WORKER_HANG in ep.landed
    restarted, v = group_restarts(agents, hung=hung)
    if hung:  # across nodes the ranks waiting on the hung one are as silent, and each node judges its own
        judged = {e.pid for a in agents for e in a.events if e.kind == "hang" and e.pid is not None}
        ep = replace(ep, struck=ep.struck | judged)
    v += pids_kept(ep, agents, lines, restarted) + world_constant(lines, world)
    v += steps_forward(lines, restarted) + all_steps_done(agents, lines, steps)
    return v + one_verdict(agents) + budget(ep, agents, cap)


def group_restarts(agents: list[AgentRecord], hung: bool = False) -> tuple[float | None, list[str]]:
    """When the group was first stopped (None: never) and the violations: in place, a group is stopped only
    where a worker failed (or could not go on in place) while a recovery was under way, ranks hung, the
    node serving the workers' store was lost, or the change came while the round's workers, started
    afresh, had not all joined it (in_place_declined), where a survivor frozen past --hang_timeout
    (`hung`) kept an in-place round from finishing (in_place_failed), or to end a failed job."""
    first: float | None = None
    v: list[str] = []
    for a in agents:
        pending: int | None = None  # the round recovering in place
        fresh: int | None = None  # the round whose workers this agent started afresh (a start or restart)
        excused = False  # the launcher said why it stops the group next
        for e in a.events:
            if e.kind == "starting":
                fresh = e.round
            if e.kind == "running" and e.in_place:
                pending = e.round
            elif e.kind == "recovered" and e.round == pending:
                pending = None
            elif e.kind == "in_place_declined":
                excused = True
                if (
                    HUNG not in e.reason
                    and STORE_LOST not in e.reason
                    and FOLLOWED not in e.reason
                    and LEFT not in e.reason
                    and (pending is None or RECOVERING not in e.reason)
                    and (fresh is None or f"round {fresh}'s ranks {NOT_WHOLE}" not in e.reason)
                ):
                    v.append(f"{a.name}: restarted the group instead of recovering in place: {e.reason}")
            elif e.kind == "in_place_failed":
                excused = True
                if not hung:  # a survivor frozen past --hang_timeout cannot join: the documented fallback
                    v.append(f"{a.name}: the in-place recovery of round {e.round} did not finish (in_place_failed)")
            elif e.kind == "stopping":
                first = e.at if first is None else min(first, e.at)
                if not excused and e.reason != "fail":
                    v.append(f"{a.name}: stopped the group ({e.reason}) with no in-place recovery declined")
                excused = False
    return first, v


def pids_kept(ep: Episode, agents: list[AgentRecord], lines: list[StepLine], restarted: float | None) -> list[str]:
    """Until the group is stopped, a rank gets a new process only where a fault ended its last one: by the
    events files (every agent's spawns) and by the workers' own step logs."""
    v: list[str] = []
    spawns = sorted((e.at, e.rank, e.pid) for a in agents for e in a.events if e.kind == "spawn")
    # a worker whose join was stuck on a rank lost since leaves to be started again (keys.REJOIN_EXIT)
    rejoined = {e.pid for a in agents for e in a.events if e.kind == "exit" and e.returncode == REJOIN_EXIT}
    struck = set(ep.struck) | rejoined
    holder: dict[int, int] = {}
    for at, rank, pid in spawns:
        old = holder.get(rank)
        holder[rank] = pid
        if old is None or old in struck or (restarted is not None and at >= restarted):
            continue
        v.append(f"rank {rank}: a new process {pid} was spawned, but its process {old} was not struck (a survivor)")
    firsts: dict[int, dict[int, float]] = {}  # rank -> pid -> its first line
    for line in lines:
        seen = firsts.setdefault(line.rank, {})
        seen[line.pid] = min(seen.get(line.pid, line.at), line.at)
    for rank, seen in sorted(firsts.items()):
        order = sorted(seen, key=seen.get)
        for old, new in zip(order, order[1:]):
            if old not in struck and (restarted is None or seen[new] < restarted):
                v.append(f"rank {rank}: stepped in process {new} after {old}, which was not struck (a survivor)")
    return v


def world_constant(lines: list[StepLine], world: int) -> list[str]:
    """Every worker of every round saw the same world size."""
    worlds = sorted({line.world for line in lines} - {world})
    return [f"the world size changed: {worlds} beside {world}"] if worlds else []


def steps_forward(lines: list[StepLine], restarted: float | None) -> list[str]:
    """Until the group is stopped: a rank's next line is at most one step behind its last (the step in
    flight, done again), and one process never logs the same step done twice."""
    v: list[str] = []
    by_rank: dict[int, list[StepLine]] = {}
    for line in sorted(lines, key=lambda x: x.at):
        if restarted is None or line.at < restarted:
            by_rank.setdefault(line.rank, []).append(line)
    for rank, seq in sorted(by_rank.items()):
        for prev, nxt in zip(seq, seq[1:]):
            if nxt.step < prev.step - 1:
                v.append(f"rank {rank}: went back from step {prev.step} to {nxt.step} (process {nxt.pid})")
            elif nxt.pid == prev.pid and nxt.kind == "step" and nxt.step <= prev.step:
                v.append(f"rank {rank}: process {nxt.pid} did step {nxt.step} twice")
    return v


def all_steps_done(agents: list[AgentRecord], lines: list[StepLine], steps: int) -> list[str]:
    """A job that succeeded: every rank logged its last step."""
    if not agents or any(a.rc != 0 for a in agents if not a.killed):
        return []
    last: dict[int, int] = {}
    for line in lines:
        last[line.rank] = max(last.get(line.rank, 0), line.step)
    short = {rank: n for rank, n in sorted(last.items()) if n != steps}
    return [f"the job succeeded but ranks stopped short of step {steps}: {short}"] if short else []


def one_verdict(agents: list[AgentRecord]) -> list[str]:
    """Each live agent that ended wrote one `finished` event whose exit code is its own; all agree."""
    v: list[str] = []
    verdicts: dict[str, int | None] = {}
    for a in agents:
        if a.killed or a.rc is None:
            continue
        ends = [e for e in a.events if e.kind == "finished"]
        if len(ends) != 1:
            v.append(f"{a.name}: {len(ends)} verdicts (finished events), not one")
            continue
        verdicts[a.name] = ends[0].exit_code
        if ends[0].exit_code != a.rc:
            v.append(f"{a.name}: its verdict says exit {ends[0].exit_code} but it exited {a.rc}")
    if len(set(verdicts.values())) > 1:
        v.append(f"the agents' verdicts differ: {verdicts}")
    return v


def budget(ep: Episode, agents: list[AgentRecord], cap: int) -> list[str]:
    """The restarts charged agree with the events: each new round a failure opened adds one, never past
    `cap`, never more than the failures; the verdict says the last count; `recovered` names the failed ranks."""
    v: list[str] = []
    hung = ep.landed.count(Fault.WORKER_HANG)
    for a in agents:
        charged, failed, failed_ranks, ran = 0, 0, [], False
        for e in a.events:
            if e.kind == "exit" and e.returncode != 0 and not e.collateral:
                failed += 1
                failed_ranks.append(e.rank)
            elif e.kind in ("running", "starting") and e.restarts is not None:
                if e.kind == "starting":  # the group (re)starts: a failure before it is no in-place round's
                    failed_ranks = []
                if ran and e.restarts not in (charged, charged + 1):  # a spare's first round carries the job's count
                    v.append(f"{a.name}: round {e.round} charged {e.restarts} restart(s) after {charged}")
                charged, ran = e.restarts, True
            elif e.kind == "recovered":  # with a spare, a lost node's ranks failed on no survivor's file
                # a rank lost twice in one recovery (its replacement too) is one rank recovered
                if (failed_ranks or not ep.spare) and sorted(e.ranks) != sorted(set(failed_ranks)):
                    v.append(f"{a.name}: round {e.round} recovered ranks {list(e.ranks)}, but {failed_ranks} failed")
                failed_ranks = []
            elif e.kind == "finished" and e.restarts is not None and e.restarts != charged:
                v.append(f"{a.name}: its verdict counts {e.restarts} restart(s), its rounds {charged}")
        if charged > cap:
            v.append(f"{a.name}: {charged} restarts charged, past --max_restarts {cap}")
        if charged > failed and not ep.spare:
            v.append(f"{a.name}: {charged} restart(s) charged, but {failed} worker(s) failed")
        if not hung and not ep.spare and charged > len(ep.struck):
            v.append(f"{a.name}: {charged} restart(s) charged, but {len(ep.struck)} worker(s) killed")
    return v
