"""The restart policy: how long to wait before a restart, and when restarting no longer helps.

Pure bookkeeping over the rounds this node saw, fed by the supervisor at each round's end; no
clock, no processes. Every node of a job keeps its own `History`, over the same rounds, so they
compute the same backoff; the node whose worker failed acts on a stop (docs/policy.md).
"""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass, field

from ..errors import RendezvousClosedError, RendezvousError, RendezvousTimeoutError, RestartBudgetExhausted
from ..exitcodes import ExitCode
from ..spec import RestartPolicy


def requeue_after(error: RendezvousError, ran: bool, budget: int) -> bool:
    """Whether a job the rendezvous ended with `error` may pass when requeued (exit 75): its restart
    budget (`budget` >= 1) was spent on failures no stop rule caught (a job closed with a verdict is
    one), or, once this node had run (`ran`), nodes were lost: the job closed without a verdict (a node
    died, the store's host left) or did not re-form in time."""
    closed = isinstance(error, RendezvousClosedError)
    spent = isinstance(error, RestartBudgetExhausted) or (closed and error.verdict is not None)  # type: ignore[attr-defined]
    lost = ran and not spent and (closed or isinstance(error, RendezvousTimeoutError))
    return (spent and budget > 0) or lost


class Stop(enum.Enum):
    """Why restarting stops, and the code every node of the job exits with."""

    DETERMINISTIC = "deterministic"
    NO_PROGRESS = "no_progress"
    QUARANTINE = "quarantine"

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.QUARANTINED if self is Stop.QUARANTINE else ExitCode.DO_NOT_REQUEUE

    def message(self, host: str, why: str) -> str:
        """The one line that says it (the failure summary's reason)."""
        return f"{host} is quarantined: {why}" if self is Stop.QUARANTINE else f"not restarting: {why}"

    @property
    def advice(self) -> str:
        """What the exit code asks of the scheduler, appended to the line in the log."""
        if self is Stop.QUARANTINE:
            return f"; leaving the job (exit {self.exit_code.value}: drain this node)"
        return f" (exit {self.exit_code.value}: do not requeue)"


@dataclass(frozen=True)
class Signature:
    """A root cause as the deterministic rule compares them: exit code, first error line, step. Not the
    rank: when every rank hits the same error, which of them fails first is chance, and the same
    failure must end the job the same way whichever it was (`rank` is for the message)."""

    rank: int = field(compare=False)
    returncode: int
    error: str
    step: int | None

    @property
    def telling(self) -> bool:
        """Only a failure with a message or a step can be told apart from another: bare codes never match."""
        return bool(self.error) or self.step is not None


@dataclass(frozen=True)
class Decision:
    """What to do after a failed round: wait `delay` s first, or `stop` (with `why`, one line)."""

    delay: float = 0.0
    stop: Stop | None = None
    why: str = ""


class History:
    """The rounds this node saw end, and what the policy makes of them."""

    def __init__(self, policy: RestartPolicy, multi_node: bool = True):
        self.policy = policy
        self.multi_node = multi_node  # one node alone is never quarantined for failures: they are the job's
        self.quick_streak = 0  # failed rounds in a row that failed quickly
        self.best: int | None = None  # the job's best step so far (this node's workers' highest progress)
        self.stalled = 0  # failed rounds in a row that did not pass `best`
        self.seen: dict[Signature, Signature] = {}  # each failure seen -> its first occurrence
        self.mine: collections.deque[bool] = collections.deque(maxlen=max(policy.quarantine_window, 1))

    def round_ended(self, ran: float, failed: bool, step: int | None, cause: Signature | None = None) -> Decision:
        """Account one round: it ran `ran` s, `failed` (charged to the budget), its best `step`, and
        `cause`, the root cause when it was one of this node's workers. Returns what to do next."""
        p = self.policy
        progressed = step is not None and (self.best is None or step > self.best)
        before, self.best = self.best, step if progressed else self.best
        if not failed:
            self.quick_streak = self.stalled = 0
            self.mine.append(False)
            return Decision()
        self.quick_streak = self.quick_streak + 1 if ran < p.quick else 1
        self.stalled = 0 if progressed or before is None else self.stalled + 1
        self.mine.append(cause is not None)
        if cause is not None and p.deterministic and cause.telling and cause in self.seen:
            at = f"at step {cause.step}" if cause.step is not None else "before any step"
            what = cause.error or f"exit code {cause.returncode}"
            first = self.seen[cause].rank
            who = f"rank {cause.rank} failed twice" if first == cause.rank else f"ranks {first} and {cause.rank} failed"
            return Decision(stop=Stop.DETERMINISTIC, why=f"{who} with the same error {at}: {what}")
        if cause is not None:
            self.seen.setdefault(cause, cause)
        if cause is not None and self.multi_node and p.quarantine_window and sum(self.mine) >= p.quarantine_after:
            return Decision(
                stop=Stop.QUARANTINE,
                why=f"its workers failed in {sum(self.mine)} of its last {len(self.mine)} rounds "
                f"(--quarantine after={p.quarantine_after},window={p.quarantine_window})",
            )
        if p.no_progress and self.stalled >= p.no_progress:
            return Decision(
                stop=Stop.NO_PROGRESS,
                why=f"{self.stalled} restarts in a row made no progress past step {self.best} "
                f"(--restart_policy no_progress={p.no_progress})",
            )
        return Decision(delay=self.backoff())

    def backoff(self) -> float:
        """0 for the first quick failure (and any slow one); then `backoff`, doubling, up to `backoff_max`."""
        if self.quick_streak <= 1:
            return 0.0
        p = self.policy
        return min(p.backoff_max, p.backoff * 2 ** (self.quick_streak - 2))
