"""What the supervisor is built from: who this agent is, how its workers start, what watches the loop.

`Supervisor(config, rendezvous, launching, identity=…, observers=…, governor=…, clock=…)`: the
configuration and the rendezvous it runs, these three parts, the policy it decides with and the
clock it reads (a fake one in the unit tests).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .. import net
from ..spec import RecoveryMode
from ..telemetry.board import Monitor
from . import process
from .filetimer import FileTimer
from .logs import Console, LogRouter
from .logs_specs import PluginLogs

TYPE_CHECKING = False  # not typing's: a plain launch imports no typing
if TYPE_CHECKING:
    from ..config import LaunchConfig
    from .recovery import Host, InPlace

Sink = Callable[[str, dict], None]  # receives every event: the events file, sd_notify, the view


def in_place(host: Host, config: LaunchConfig, environ: dict[str, str]) -> InPlace | None:
    """`host`'s in-place recoveries where `config` asks for them (--recovery in-place); `environ`: the workers'."""
    if config.recovery is not RecoveryMode.IN_PLACE:
        return None
    # Imported only here: recovery and its store client cost every other launch's start ~3 ms.
    from .recovery import in_place

    return in_place(host, config, environ)


@dataclass(frozen=True)
class Identity:
    """Who this agent is: its id (it marks every process the agent starts) and its host's name."""

    agent_id: str
    host: str

    @classmethod
    def of(cls, agent_id: str = "", host: str = "") -> Identity:
        """This process's identity: a fresh id and this host's name, unless given."""
        return cls(agent_id or f"{os.getpid()}-{os.urandom(4).hex()}", host or net.hostname())


@dataclass
class Launching:
    """How the round's workers start and where their output goes."""

    logs: LogRouter  # worker lines to the console and the per-rank files
    run_dir: str  # attempt_<round>/ folders of logs and error files go here
    starter: process.Starter = field(default_factory=process.Spawner)  # spawned, or forked from the zygote
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))  # what the workers inherit
    console: Console = field(default_factory=Console)  # where worker lines shown on the console go
    guard: process.Guard | None = None  # the helper that outlives the agent to sweep its processes
    logs_plugin: PluginLogs | None = None  # --logs_specs NAME: a torch LogsSpecs places the files


@dataclass(frozen=True)
class Observers:
    """What the loop tells and what it runs every turn."""

    sinks: Sequence[Sink] = ()  # every event: the events file, sd_notify, the accountant, the view
    periodic: Sequence[Callable[[], None]] = ()  # cheap checks once per loop turn (the sd_notify watchdog)
    monitor: Monitor | None = None  # the job board: this node's reports, and the straggler judge
    watchdog: FileTimer | None = None  # torch's file-timer watchdog, where TORCHELASTIC_ENABLE_FILE_TIMER=1
