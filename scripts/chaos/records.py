"""The campaign's vocabulary: the fault kinds, the job shapes, the timings, and the typed records an episode leaves."""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

NODES = 3
# the episodes' keep_alive_interval x keep_alive_max_attempt (0.5 s x 4; the default is 6 s since issue 32)
LIVENESS = 2.0
READ_TIMEOUT = 3.0  # the episodes' --rdzv_conf read_timeout
REFORM_S = 10.0  # after the liveness timeout: for the others to see a cut node gone and re-form, on busy cores
# A node cut off for good stops its workers within this of the cut: c10d's client waits read_timeout + 5 s
# for an answer (etcd: read_timeout after its lease's refreshes began to fail), and a few s on busy cores.
STOP_S = READ_TIMEOUT + 5.0 + 4.0
FOR_GOOD = float("inf")  # the length of a link cut that lasts until the episode ends


class Fault(enum.Enum):
    """A kind of fault an episode injects (see faults.py for what each does)."""

    WORKER_KILL = "worker-kill"
    AGENT_KILL = "agent-kill"
    NODE_FREEZE = "node-freeze"
    STORE_KILL = "store-kill"  # c10d: the job ends; etcd: every member killed and restarted on its data
    DISK_FULL = "disk-full"  # root only
    LINK_CUT = "link-cut"  # root and namespaces only: down for 1-12 s, then up
    LINK_DOWN = "link-down"  # root and namespaces only: down until the episode ends
    MEMBER_KILL = "etcd-member-kill"  # a follower; etcd only
    LEADER_KILL = "etcd-leader-kill"  # etcd only
    WORKER_FREEZE = "worker-freeze"  # in-place: one worker SIGSTOPped for less than --hang_timeout
    WORKER_HANG = "worker-hang"  # in-place: one worker SIGSTOPped past --hang_timeout
    AFTER_COMMIT = "after-commit"  # in-place: a worker SIGKILLs itself after its optimizer step, before a collective
    STARTUP = "startup"  # in-place: a worker SIGKILLs itself before Job() (it never joined)
    TEARDOWN = "teardown"  # in-place: a worker SIGKILLs itself after the last step, before job.close()
    TWO_RANKS = "two-ranks"  # in-place: two workers SIGKILLed 40-70 ms apart
    RECOVERY_FAULT = "recovery-fault"  # in-place: a worker SIGKILLed, another while its recovery is under way


COMMON = [
    Fault.WORKER_KILL,
    Fault.AGENT_KILL,
    Fault.NODE_FREEZE,
    Fault.STORE_KILL,
    Fault.DISK_FULL,
    Fault.LINK_CUT,
    Fault.LINK_DOWN,
]
FAULTS = {"c10d": COMMON, "etcd": [*COMMON, Fault.MEMBER_KILL, Fault.LEADER_KILL]}
STORE_FAULTS = {Fault.STORE_KILL, Fault.MEMBER_KILL, Fault.LEADER_KILL}  # at most one per episode
STOPS_A_NODE = {Fault.AGENT_KILL, Fault.NODE_FREEZE, Fault.STORE_KILL, Fault.LINK_CUT, Fault.LINK_DOWN}
QUARANTINES = {Fault.WORKER_KILL}  # the spares shape's --quarantine after=1: its node leaves the job
LINK_FAULTS = {Fault.LINK_CUT, Fault.LINK_DOWN}
# The in-place shape's kinds; agent-kill there is a member's agent with a spare standing by, and the job
# runs on two nodes and a spare (multi-node in-place recovery), so it is off unless asked for.
IN_PLACE_FAULTS = [
    Fault.WORKER_KILL,
    Fault.WORKER_FREEZE,
    Fault.WORKER_HANG,
    Fault.AGENT_KILL,
    Fault.AFTER_COMMIT,
    Fault.STARTUP,
    Fault.TEARDOWN,
    Fault.TWO_RANKS,
    Fault.RECOVERY_FAULT,
]
IN_PLACE_DEFAULT = tuple(IN_PLACE_FAULTS)
# The kinds a worker inflicts on itself (the worker's DIE_AT, set before the job starts): a fault at an exact
# point of the step, not at a time. Each kind's value is the worker's phase.
SELF_INFLICTED = {Fault.AFTER_COMMIT, Fault.STARTUP, Fault.TEARDOWN}
# The restarts each in-place kind may cost at most (the exact in place's bounds): a teardown death none (the
# training was over), two ranks lost at once one, a second fault during a recovery one more.
CHARGES = {
    Fault.WORKER_KILL: 1,
    Fault.WORKER_FREEZE: 0,
    Fault.WORKER_HANG: 1,
    Fault.AGENT_KILL: 1,
    Fault.AFTER_COMMIT: 1,
    Fault.STARTUP: 1,
    Fault.TEARDOWN: 1,  # before `close()`: its replacement runs the script's tail (a step none)
    Fault.TWO_RANKS: 1,
    Fault.RECOVERY_FAULT: 2,
}
HANG_TIMEOUT = 5.0  # the in-place shape's --hang_timeout: a worker-freeze stays under it, a worker-hang passes it
IN_PLACE_TIMEOUT = 60.0  # the in-place shape's --in_place_timeout (the default)
IN_PLACE_STEP_COUNT = 100  # the in-place worker's steps, 0.05 s each
JOIN_DELAY = 0.6  # s a replacement waits before it joins, in an episode with a recovery-fault: its recovery lasts


def in_place_world(spare: bool) -> int:
    """The in-place job's world size: one node of 3 workers, or two members of 2 (with a spare)."""
    return 4 if spare else 3


RIDDEN_OUT = {Fault.MEMBER_KILL, Fault.LEADER_KILL, Fault.DISK_FULL}  # the job goes on as if nothing happened


class Shape(enum.Enum):
    """The job an episode runs."""

    ELASTIC = "elastic"  # --nnodes 2:3, three members
    SPARES = "spares"  # --nnodes 2, two members and a spare
    IN_PLACE = "in-place"  # --recovery in-place: one node of 3 workers (with agent-kill: --nnodes 2 and a spare)


@dataclass(frozen=True)
class Die:
    """A self-inflicted fault the in-place worker is told of (DIE_AT): `rank` SIGKILLs itself at `phase`
    (the kind's value) of step `step` (startup, teardown: any step), `delay` s after reaching it."""

    rank: int
    step: int
    phase: str
    delay: float = 0.0

    def entry(self) -> str:
        """Its DIE_AT entry, "RANK STEP PHASE DELAY"."""
        return f"{self.rank} {self.step} {self.phase} {self.delay:g}"


@dataclass
class Episode:
    """One episode: its seed's planned faults, then what the faults did and the violations found."""

    backend: str
    seed: int
    shape: Shape = Shape.ELASTIC
    faults: list[tuple[float, Fault]] = field(default_factory=list)
    landed: list[Fault] = field(default_factory=list)  # the faults that struck, in order
    done: list[str] = field(default_factory=list)  # what was done, in order, for the report
    expect: list[tuple[str, str]] = field(default_factory=list)  # (what, regex a survivor's stderr must hold)
    violations: list[str] = field(default_factory=list)
    frozen: set[str] = field(default_factory=set)  # the nodes it froze
    victims: list[str] = field(default_factory=list)  # the node each landed fault struck (the store: "store")
    cuts: list[tuple[str, float, float]] = field(default_factory=list)  # (node, when, how long) its link was cut
    struck: set[int] = field(default_factory=set)  # in-place: the worker pids a fault ended (killed, hung, lost)
    spare: bool = False  # in-place: two members and a spare (agent-kill asked for), not one node
    dies: list[Die] = field(default_factory=list)  # in-place: where workers SIGKILL themselves (DIE_AT)
    join_delay: float = 0.0  # in-place: JOIN_DELAY, s a replacement waits before it joins
    train_seed: int = 0  # in-place: the worker's SEED (its data, initial model and dropout)
    seconds: float = 0.0
    kept: Path | None = None  # --keep: the episode's folder


@dataclass(frozen=True)
class Start:
    """A "start" line of the steps worker (tests/workers/steps.py): one worker of one round began."""

    agent: str
    rank: str
    world: str
    restart: str
    round: str
    at: float  # when the campaign read it (time.monotonic)


START = re.compile(r"(\w+)=(\S+)")


@dataclass(frozen=True)
class AgentRecord:
    """What one agent left once its episode was over: its exit, its output with each line's arrival time,
    and its processes still alive after it ended."""

    name: str
    rc: int | None  # None: still running after the bound; -9: SIGKILLed by the campaign
    killed: bool = False  # by the campaign: its lines may be lost with it
    out: tuple[str, ...] = ()
    out_at: tuple[float, ...] = ()
    err: tuple[str, ...] = ()
    err_at: tuple[float, ...] = ()
    ended_at: float | None = None  # when its stdout closed
    left: tuple[int, ...] = ()  # pids carrying its token after it ended (and a wait of up to 10 s)
    events: tuple[Event, ...] = ()  # in-place: its --events_file, in order

    def starts(self) -> list[Start]:
        """Every "start" line of its workers, in order."""
        found = []
        for line, at in zip(self.out, self.out_at):
            if " start rank=" in line:
                kv = dict(START.findall(line))
                found.append(Start(self.name, kv["rank"], kv["world"], kv["restart"], kv["round"], at))
        return found


@dataclass(frozen=True)
class Event:
    """One line of an agent's --events_file, the fields the in-place invariants read."""

    kind: str
    at: float  # time.time() of the agent
    rank: int | None = None
    pid: int | None = None
    round: int | None = None
    restarts: int | None = None
    cause: str = ""  # rendezvous: start, in_place, failure, ...
    reason: str = ""  # stopping, in_place_declined
    collateral: bool = False  # exit: stopped by the launcher, not a failure
    returncode: int | None = None  # exit
    exit_code: int | None = None  # finished
    in_place: bool = False  # running: a round opened by an in-place recovery
    ranks: tuple[int, ...] = ()  # recovered

    @classmethod
    def parse(cls, line: str) -> Event | None:
        """The event of one JSON line (None: not one, e.g. the line a SIGKILL cut short)."""
        try:
            d = json.loads(line)
        except ValueError:
            return None
        return cls(
            d.get("event", ""),
            float(d.get("time", 0.0)),
            d.get("rank"),
            d.get("pid"),
            d.get("round"),
            d.get("restarts"),
            str(d.get("cause", "")),
            str(d.get("reason", "")),
            bool(d.get("collateral", False)),
            d.get("returncode"),
            d.get("exit_code"),
            bool(d.get("in_place", False)),
            tuple(d.get("ranks", ())),
        )


@dataclass(frozen=True)
class StepLine:
    """A line of the in-place worker's step log (tests/workers/in_place_steps.py): "start" once a process
    holds the state, "step" after each step done (with the all-reduced loss), "applied" when an optimizer
    step ran (`step`: that step's index), "die" right before it SIGKILLs itself (its `phase`), "final"
    after the last step (the optimizer steps it `applied`, those its state's `lineage` applied, and the
    `digest` of its final weights); `step` counts the steps done, `at` is time.time()."""

    kind: str
    pid: int
    rank: int
    world: int
    round: int
    step: int
    at: float
    phase: str = ""  # die
    loss: float | None = None  # step
    applied: int = -1  # final
    lineage: int = -1  # final
    digest: str = ""  # final

    @classmethod
    def parse(cls, line: str) -> StepLine | None:
        """The record of one line (None: a line cut short by a kill)."""
        parts = line.split()
        if len(parts) < 7 or LINE_FIELDS.get(parts[0]) is None or len(parts) not in LINE_FIELDS[parts[0]]:
            return None
        try:
            head = cls(parts[0], *map(int, parts[1:6]), float(parts[6]))
            tail = parts[7:]
            if head.kind == "step" and tail:
                return replace(head, loss=float(tail[0]))
            if head.kind == "die":
                return replace(head, phase=tail[0])
            if head.kind == "final":
                return replace(head, applied=int(tail[0]), lineage=int(tail[1]), digest=tail[2])
            return head
        except ValueError:
            return None


LINE_FIELDS = {"start": (7,), "step": (7, 8), "applied": (7,), "die": (8,), "final": (10,)}  # a kind's fields
