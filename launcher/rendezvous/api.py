"""The rendezvous interface the supervisor talks to, and what every backend is given beside its settings."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from ..spec import Round, Verdict
from .store import Store

TYPE_CHECKING = False  # not typing's: typing's import costs a launch's start ~4 ms
if TYPE_CHECKING:
    from typing import Protocol
else:
    Protocol = object  # the type checker's; at run time a plain base


class Cause(enum.Enum):
    """Why the supervisor asks for a round; only FAILURE is charged to the restart budget."""

    START = "start"
    FAILURE = "failure"
    MEMBERSHIP = "membership"

    def change(self, node: str) -> str:
        """What node `node`, asking for the next round for this cause, writes as its round's change: what
        the other nodes say ("membership changed (...)") when it is the first to end the round."""
        if self is Cause.FAILURE:
            return f"a worker failed on {node}"
        if self is Cause.MEMBERSHIP:
            return f"{node} re-forms the group"
        return f"{node} starts"


@dataclass(frozen=True)
class JobParams:
    """The general fields a backend needs beside its own settings (torch: RendezvousParameters)."""

    run_id: str
    nproc_per_node: int
    min_nodes: int = 1
    max_nodes: int = 1
    max_restarts: int = 0
    local_addr: str | None = None  # --local_addr: this node's address as the others reach it
    join_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class LastWill:
    """Bytes this agent's guard sends to host:port the moment the agent died: a store that cannot tell a
    death from a lost connection learns it so (c10d: the death certificate that ends its session)."""

    host: str
    port: int
    payload: bytes = field(repr=False)
    answer: int = 0  # bytes of the answer to read back (0: until the server closes the connection)


def last_will(handler: object) -> LastWill | None:
    """The handler's last will (a backend that has one offers `last_will()`), or None."""
    will = getattr(handler, "last_will", None)
    return will() if will is not None else None


def offer_port(handler: object, port: int) -> bool:
    """Offer `port` (0: a fresh one each round) as this node's bootstrap port in the rounds it joins, where
    the backend forms rounds over a store (`offer_port`); its agent keeps serving the workers' store there."""
    offer = getattr(handler, "offer_port", None)
    if offer is not None:
        offer(port)
    return offer is not None


class MembershipChanged:
    """Posted by a backend's watch: another node joined, left or failed; start a new round.
    `closed`: the job was closed, so the next round will not form (its error says why).
    `failed`: a worker failed on another node (`reason` names it): a restart, not a membership change."""

    def __init__(self, reason: str, closed: bool = False, failed: bool = False):
        self.reason = reason
        self.closed = closed
        self.failed = failed

    def __repr__(self) -> str:
        return f"MembershipChanged({self.reason!r}, closed={self.closed}, failed={self.failed})"


class WaitKind(enum.Enum):
    """What a node waits for while it has no round."""

    NODES = "nodes"  # a round forming: the nodes it needs
    SPARE = "spare"  # the job is full: this node waits as a spare for a member to be lost
    REPLACEMENT = "replacement"  # the job lost members and is below MIN: a node to fill their group ranks


@dataclass(frozen=True)
class WaitReport:
    """One line on what this node waits for (logged, and the live view's caption), and its kind."""

    line: str
    kind: WaitKind = WaitKind.NODES


@dataclass(frozen=True)
class SpareLost:
    """Posted by the watch of the node with group rank 0: a spare of the job died (its id)."""

    node: str


FINISHED = "it finished"  # how the close of a job that succeeded begins: its spares end with exit 0
JOB_FINISHED = "the job finished"  # the last round's change once every member is done: no re-forming


def budget_spent(used: int, max_restarts: int) -> bool:
    """The one restart-budget rule, for every backend: `used` counts the restarts charged so far,
    this failure's included. A job restarts at most `max_restarts` times: the failure after that ends it."""
    return used > max_restarts


class RendezvousHandler(Protocol):
    """What every backend offers the supervisor."""

    def next_round(
        self, cause: Cause, verdict: Verdict | None = None, waiting: Callable[[WaitReport], None] | None = None
    ) -> Round:
        """Block until this node is in a new round; raises a RendezvousError (budget spent, closed, timeout).
        `verdict`: this node's root cause of a FAILURE, for the other nodes should it end the job.
        `waiting`: told every few seconds what this node waits for (the line also logged)."""

    def watch(self, rnd: Round, post: Callable[[object], None]) -> None:
        """Start watching `rnd`: post `MembershipChanged` when the job must re-form."""

    def shared_store(self) -> Store | None:
        """The store the nodes share, where other records of the job may live too (the job board);
        None when there is none (`local`, `static`)."""

    def shutdown(self, succeeded: bool, why: str = "") -> None:
        """Leave the job: close it for everyone when this node is done or gave up. `why`: what the
        others are told when it leaves a running job (e.g. "stopped by SIGTERM")."""

    def close(self, verdict: Verdict | None, reason: str) -> None:
        """End the job for every node, `verdict` (its `code` set) as the job's: the restart policy
        stopped it (docs/policy.md). Call `shutdown` after."""
