"""The rendezvous interface the supervisor talks to, and the table of backends."""

from __future__ import annotations

import enum
from typing import Callable, Protocol

from ..config import LaunchConfig
from ..spec import Round


class Cause(enum.Enum):
    """Why the supervisor asks for a round; only FAILURE is charged to the restart budget."""

    START = "start"
    FAILURE = "failure"
    MEMBERSHIP = "membership"


class MembershipChanged:
    """Posted by a backend's watch: another node joined, left or failed; start a new round."""

    def __init__(self, reason: str):
        self.reason = reason

    def __repr__(self) -> str:
        return f"MembershipChanged({self.reason!r})"


class RendezvousHandler(Protocol):
    """What every backend offers the supervisor."""

    def next_round(self, cause: Cause) -> Round:
        """Block until this node is in a new round; raises a RendezvousError (budget spent, closed, timeout)."""

    def watch(self, rnd: Round, post: Callable[[object], None]) -> None:
        """Start watching `rnd`: post `MembershipChanged` when the job must re-form."""

    def shutdown(self, succeeded: bool) -> None:
        """Leave the job: close it for everyone when this node is done or gave up."""


def create_rendezvous(config: LaunchConfig) -> RendezvousHandler:
    """The handler for `config.rdzv_backend`; a backend loads its store client only inside (none imports torch)."""
    if config.rdzv_backend == "c10d":
        from .c10d import C10dRendezvous

        return C10dRendezvous(config)
    if config.rdzv_backend == "etcd":
        from .etcd import EtcdRendezvous

        return EtcdRendezvous(config)
    from .local import LocalRendezvous

    return LocalRendezvous(config)
