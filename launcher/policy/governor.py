"""Between rounds: the restart policy, the health gate and the quarantine, as the supervisor asks them.

The supervisor owns the loop and the workers; it tells the governor when a round ended (with the
members it had) and asks, before each round, whether this node may join. The governor decides
and remembers; it never touches a process (docs/policy.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from ..net import hostname
from ..rendezvous.keys import Keys
from ..rendezvous.store import Store
from ..spec import AGENT_ID_VAR, Failure, RestartPolicy
from ..telemetry.summary import read_error_file
from .health import HealthGate
from .quarantine import QuarantineBook, make_record, note_host
from .restart import Decision, History, Signature

TYPE_CHECKING = False  # not typing's: typing's import costs a launch's start ~4 ms
if TYPE_CHECKING:
    from ..config import LaunchConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ended:
    """One round as it ended on this node: how long it ran, whether it failed, what the workers reached."""

    ran: float
    failed: bool  # charged to the restart budget (a worker failed here or on another node)
    steps: Sequence[int | None]  # each local worker's last launcher.progress(step=)
    cause: Failure | None = None  # the root cause, when it was one of this node's workers
    last_line: str = ""  # the root cause's last stderr line (its error, when it wrote no error file)


class Governor:
    """The policy of one node: `round_ended` after each round, `admit` before each join."""

    def __init__(
        self,
        policy: RestartPolicy,
        host: str,
        node: str = "",
        *,
        multi_node: bool = True,
        gate: HealthGate | None = None,
        book: Callable[[], QuarantineBook | None] = lambda: None,
        note: tuple[str, str] | None = None,
        wall: Callable[[], float] = time.time,
    ):
        self.policy = policy
        self.history = History(policy, multi_node)
        self.host = host
        self.node = node
        self.gate = gate
        self._book = book  # the job's quarantine records, once the rendezvous has a store (None: none)
        self.note = note  # (file, this node's name in it): where a scheduler reads quarantined nodes
        self.wall = wall
        self.known: tuple[str, ...] = ()  # the job's quarantined hosts as last read: "host (why)"

    def round_ended(self, ended: Ended) -> Decision:
        """What to do next: restart now, after `delay` s, or stop (and why)."""
        steps = [s for s in ended.steps if s is not None]
        cause = ended.cause
        signature = None
        if cause is not None:
            error = cause.reason or read_error_file(cause.error_file)[0] or ended.last_line
            signature = Signature(
                cause.worker.rank, cause.exit.returncode, (error.splitlines() or [""])[0][:300], cause.step
            )
        return self.history.round_ended(ended.ran, ended.failed, max(steps) if steps else None, signature)

    def admit(self, previous_pids: Collection[int] = ()) -> str:
        """Whether this node may join the next round: "" if so, else one line why not (it is quarantined)."""
        book = self._book()
        if book is not None:
            try:
                now = self.wall()
                active = [r for r in book.all() if r.active(now)]
            except Exception as e:  # the store is the rendezvous's to judge; joining will say
                log.debug("reading the job's quarantine records failed: %s", e, exc_info=True)
                active = []
            self.known = tuple(dict.fromkeys(f"{r.host} ({r.why})" for r in active))
            mine = [r for r in active if r.host == self.host]
            record = max(mine, key=lambda r: r.until) if mine else None
            if record is not None:
                if self.note:
                    note_host(*self.note)
                return record.left(now)
        if self.gate is None:
            return ""
        problem = self.gate.check(previous_pids)
        if problem and self.gate.cut_short:
            # The agent is leaving (a SIGTERM, its peers gone) and killed the check: no verdict on the node.
            # Noted, this healthy node was excluded from the job's requeue beside the one that failed.
            return "the agent is leaving: its health check was stopped"
        if problem:
            self.quarantine(f"health check failed: {problem}")
            return f"health check failed: {problem}"
        return ""

    def close(self) -> None:
        """The agent is leaving: a health check still running is killed."""
        if self.gate is not None:
            self.gate.cancel()

    def quarantine(self, why: str) -> None:
        """Record this host in the job's store for the cooldown, and name it in the scheduler's file."""
        if self.note:
            note_host(*self.note)
        book = self._book()
        if book is None:
            return
        try:
            book.add(make_record(self.host, why, self.policy.quarantine_cooldown, self.node, self.wall()))
            self.known += (f"{self.host} ({why})",)
        except Exception as e:  # the exit code and the line still say it; the trace at debug level
            log.warning(f"could not record the quarantine in the job's store: {e}")
            log.debug("recording the quarantine failed", exc_info=True)


def governor_for(config: LaunchConfig, store: Store | None, agent_id: str, environ: Mapping[str, str]) -> Governor:
    """This node's governor: the job's policy, its health gate, and the job's quarantine records in
    `store` (the rendezvous' shared store; None: no records, only the exit code and the line)."""
    keys = Keys(config.run_id)
    book = QuarantineBook(store, keys.quarantined, keys.quarantine) if store is not None else None
    return Governor(
        config.restart_policy,
        node_name(environ),
        agent_id,
        multi_node=config.multi_node,
        gate=gate_from(config.health_check, config.health_check_timeout, config.gpus, environ, agent_id),
        book=lambda: book,
        note=note_from(config.quarantine_file, environ),
    )


def node_name(environ: Mapping[str, str]) -> str:
    """The name a quarantine gives this node: Slurm's (what --exclude takes), else its host name."""
    return environ.get("SLURMD_NODENAME") or hostname()


def note_from(path: str | None, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """$LAUNCHER_QUARANTINE_FILE and the name this node goes by there."""
    return (path, node_name(environ)) if path else None


def gate_from(
    command: str | None, timeout: float, gpus: Sequence[str], environ: Mapping[str, str], agent_id: str = ""
) -> HealthGate:
    """The node's gate: the command (marked as this agent's, like its workers), and the GPUs its
    workers use (--gpus, else CUDA_VISIBLE_DEVICES)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = tuple(gpus) or tuple(v.strip() for v in visible.split(",") if v.strip() and not v.strip().startswith("-"))
    env = {**environ, AGENT_ID_VAR: agent_id} if agent_id else None
    return HealthGate(command, timeout=timeout, gpus=ids, env=env)
