"""What a node reports about itself while a round runs: `NodeReport` with a `WorkerReport` per
worker. The supervisor builds them, the job board keeps them (one key per node), `launcher status`
and the straggler judge read them back.

A report read back from the shared store may be garbled or hostile: `NodeReport.decode` bounds it
(MAX_VALUE, at most MAX_WORKERS workers) and checks it field by field like every record the
protocol reads (`rendezvous.records`); a bad node is left out, a bad worker is dropped, and a bad
optional field (progress, step, rate) reads as unknown.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from ..errors import RendezvousError
from ..rendezvous.records import MAX_VALUE, address, checked, integer, load, number, text
from .goodput import Breakdown

MAX_WORKERS = 1024  # workers read back per node; more is not a node of ours

WORKER_FIELDS = {
    "rank": integer(0, 1 << 31),
    "local_rank": integer(0, 1 << 20),
    "pid": integer(0, 1 << 31),
    "state": text(255),
    "restarts": integer(0, 1 << 31),
}
OPTIONAL_WORKER_FIELDS = {
    "progress_age": number,
    "step": integer(-(1 << 63), 1 << 63),
    "rate": number,
    "straggler": lambda v: type(v) is bool,
}
NODE_FIELDS = {
    "host": text(255),
    "state": text(255),
    "round": integer(0, 1 << 31),
    "restarts": integer(0, 1 << 31),
    "max_restarts": integer(0, 1 << 31),
    "time": number,
    "node": address,
}


@dataclass(frozen=True)
class WorkerReport:
    """One worker: who it is, its state, and how it progresses (None: unknown)."""

    rank: int
    local_rank: int
    pid: int
    state: str
    restarts: int
    progress_age: float | None = None  # seconds since its last output or progress call
    step: int | None = None  # its last `launcher.progress(step=)`
    rate: float | None = None  # steps per second over the supervisor's window
    straggler: bool | None = None  # flagged by --straggler_threshold


@dataclass(frozen=True)
class NodeReport:
    """One node: its group's state in its round and its workers. `node`, `group_rank` and `time` are
    stamped as it is published."""

    host: str
    state: str
    round: int
    restarts: int
    max_restarts: int
    workers: tuple[WorkerReport, ...] = ()
    node: str = ""  # host:pid of its agent
    group_rank: int = -1
    time: float = 0.0  # when it was published (the publishing host's wall clock)
    goodput: Breakdown | None = None  # this node's goodput so far (see launcher.telemetry.goodput)

    def stamped(self, node: str, group_rank: int, now: float) -> NodeReport:
        return replace(self, node=node, group_rank=group_rank, time=now)

    def encode(self) -> bytes:
        """JSON, within MAX_VALUE: a node of very many workers is published without them."""
        raw = json.dumps(asdict(self)).encode()
        return raw if len(raw) <= MAX_VALUE else json.dumps(asdict(replace(self, workers=()))).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> NodeReport | None:
        """A report read back, checked; None when it is missing, garbled or hostile."""
        try:
            value = checked(load(raw, "node report"), NODE_FIELDS, "node report")
        except RendezvousError:
            return None
        if not isinstance(value.get("workers"), list):
            return None
        workers = tuple(w for w in map(_worker, value["workers"][:MAX_WORKERS]) if w is not None)
        group_rank = value.get("group_rank")
        return cls(
            **{name: value[name] for name in NODE_FIELDS},
            workers=workers,
            group_rank=group_rank if integer(0, 1 << 31)(group_rank) else -1,
            goodput=Breakdown.from_dict(value.get("goodput")),
        )


def _worker(value: object) -> WorkerReport | None:
    if not isinstance(value, dict) or not all(name in value and ok(value[name]) for name, ok in WORKER_FIELDS.items()):
        return None
    known = {name: value.get(name) if ok(value.get(name)) else None for name, ok in OPTIONAL_WORKER_FIELDS.items()}
    return WorkerReport(**{name: value[name] for name in WORKER_FIELDS}, **known)
