"""The campaign's vocabulary: the fault kinds, the job shapes, the timings, and the typed records an episode leaves."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
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
RIDDEN_OUT = {Fault.MEMBER_KILL, Fault.LEADER_KILL, Fault.DISK_FULL}  # the job goes on as if nothing happened


class Shape(enum.Enum):
    """The job an episode runs."""

    ELASTIC = "elastic"  # --nnodes 2:3, three members
    SPARES = "spares"  # --nnodes 2, two members and a spare


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

    def starts(self) -> list[Start]:
        """Every "start" line of its workers, in order."""
        found = []
        for line, at in zip(self.out, self.out_at):
            if " start rank=" in line:
                kv = dict(START.findall(line))
                found.append(Start(self.name, kv["rank"], kv["world"], kv["restart"], kv["round"], at))
        return found
