"""A worker of the current round as the supervisor keeps it (`Member`): its process, streams and
files, its state, and how it progresses (idle time, steps per second), told as a `WorkerRow` for the
live view and a `WorkerReport` for the job board.
"""

from __future__ import annotations

import collections
import os
import time
from dataclasses import dataclass, field

from .logs import Stream
from .process import WorkerProcess
from .reports import WorkerReport
from .spec import Worker, WorkerRow, WorkerState

RATE_WINDOW = 10.0  # seconds of step samples a step rate is measured over


@dataclass(eq=False)
class Member:
    """A worker of the current round and its live process."""

    worker: Worker
    proc: WorkerProcess
    streams: list[Stream]
    error_file: str
    log_files: tuple[str, ...]
    started: float = 0.0
    progress_file: str | None = None
    hung: bool = False  # declared hung by --hang_timeout: a failure, not collateral
    state: WorkerState = WorkerState.RUNNING
    signalled: bool = False  # the launcher asked it to stop: its failure is collateral
    steps: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))  # (time, step) samples
    straggler: bool = False  # flagged by --straggler_threshold (shown, never acted on)

    def idle(self, now: float) -> float:
        """Seconds since the worker last printed a line or called launcher.progress(); `now`: the supervisor's clock."""
        idle = now - max([self.started] + [s.last_at for s in self.streams if s.last_at])
        try:
            idle = min(idle, time.time() - os.stat(self.progress_file).st_mtime)  # type: ignore[arg-type]
        except (OSError, TypeError):
            pass
        return max(0.0, idle)

    def step_rate(self, now: float) -> tuple[int | None, float | None]:
        """The worker's last `launcher.progress(step=)` and its steps per second over RATE_WINDOW (None: unknown)."""
        try:
            with open(self.progress_file, "rb") as f:  # type: ignore[arg-type]
                step = int(f.read(64).strip() or b"x")
        except (OSError, TypeError, ValueError):
            return None, None
        self.steps.append((now, step))
        while len(self.steps) > 2 and now - self.steps[1][0] >= RATE_WINDOW:
            self.steps.popleft()
        then, first = self.steps[0]
        return step, (round((step - first) / (now - then), 3) if now - then >= 1.0 else None)

    @property
    def last_line(self) -> str:
        """The last line it printed, on either stream."""
        return max(self.streams, key=lambda s: s.last_at).last_line if self.streams else ""

    def view(self) -> WorkerRow:
        """Its row in the live view."""
        w = self.worker
        return WorkerRow(
            w.rank, w.local_rank, self.proc.pid, self.state.value, self.started, self.last_line, self.straggler
        )

    def report(self, restarts: int, now: float) -> WorkerReport:
        """Its row in `launcher status`, on the job board (reads its progress file: one caller, the board's monitor)."""
        step, rate = self.step_rate(now)
        return WorkerReport(
            rank=self.worker.rank,
            local_rank=self.worker.local_rank,
            pid=self.proc.pid,
            state=self.state.value,
            restarts=restarts,
            progress_age=round(self.idle(now), 1),
            step=step,
            rate=rate,
            straggler=self.straggler,
        )
