"""What reaches the supervisor's loop from other threads (the rendezvous thread posts a round, its
failure, a refusal or what a forming round waits for), and the stop of the group in progress."""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass

from ..errors import RendezvousError
from ..rendezvous.api import WaitKind
from ..spec import Round


@dataclass(frozen=True)
class RoundReady:
    """The rendezvous formed the next round."""

    rnd: Round


@dataclass(frozen=True)
class RoundFailed:
    """The rendezvous could not form one: the job ends with `error`."""

    error: RendezvousError


@dataclass(frozen=True)
class Refused:
    """The governor keeps this node out of the next round (quarantined, or its health check failed)."""

    why: str


@dataclass(frozen=True)
class Waiting:
    """What the forming round waits for (the rendezvous says so every few seconds)."""

    line: str
    kind: WaitKind = WaitKind.NODES


class Then(enum.Enum):
    """What the supervisor does once a stop of the group is complete."""

    RESTART = "restart"  # a worker failed: a new round, charged to the restart budget
    MEMBERSHIP = "membership"  # another node joined, left or died: a new round, free of charge
    SIGNAL = "signal"  # the launcher was told to stop: the group ends FAILED with 128+N
    FAIL = "fail"  # a worker cannot be started (its command vanished): the group ends FAILED


@dataclass
class Stopping:
    """A stop of the group in progress: what follows it, its SIGKILL deadline, its signal, when it began."""

    then: Then
    deadline: float
    signum: int = signal.SIGTERM
    begun: float = 0.0
