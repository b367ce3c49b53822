"""The agent side of torch's file-based watchdog (`TORCHELASTIC_ENABLE_FILE_TIMER=1`).

Workers arm timers with `torch.distributed.elastic.timer.FileTimerClient` (or the `expires()`
context manager over it): JSON lines on a named pipe, each `{"version": 1, "pid", "scope_id",
"expiration_time", "signal"}`, a negative expiration releasing the scope. The agent reads the pipe at
every turn of its loop (torch's server polls every 0.1 s, as `--monitor_interval` does) and hands the
supervisor each timer past its expiration that carries a signal; the supervisor sends that signal to
the worker and counts its end as a failure that names the scope. Unlike torch's server, the agent
itself is never killed for it: the job restarts or ends with its summary.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..spec import WorkerState

ENABLE_VAR, FILE_VAR = "TORCHELASTIC_ENABLE_FILE_TIMER", "TORCHELASTIC_TIMER_FILE"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Expired:
    """A timer that ran out: the worker's pid, the scope it armed, the signal it asked to be ended with."""

    pid: int
    scope: str
    signal: int


class FileTimer:
    """Owns the named pipe; `poll()` reads the requests that came in and returns the timers that expired."""

    def __init__(self, path: str, clock: Callable[[], float] = time.time):
        self.path = path
        self._clock = clock  # wall clock: expiration times are time.time() in the workers
        self._timers: dict[tuple[int, str], tuple[float, int]] = {}
        self._partial = b""
        self._made = False
        try:
            os.mkfifo(path)
            self._made = True
        except FileExistsError:
            if not stat.S_ISFIFO(os.stat(path).st_mode):
                raise OSError(f"{path} exists and is not a named pipe") from None
        # Non-blocking read end, open for the whole job: a client's non-blocking open needs a reader.
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def poll(self) -> list[Expired]:
        """Take in every request waiting in the pipe, then hand back (and drop) what has expired."""
        self._read()
        now = self._clock()
        out = [Expired(pid, scope, sig) for (pid, scope), (at, sig) in self._timers.items() if at <= now]
        for e in out:
            del self._timers[(e.pid, e.scope)]
        return [e for e in out if e.signal > 0]  # torch: a timer without a signal expires quietly

    def forget(self, pids: Iterable[int]) -> None:
        """Drop the timers of workers that ended (a round is over)."""
        gone = set(pids)
        self._timers = {k: v for k, v in self._timers.items() if k[0] not in gone}

    def close(self) -> None:
        os.close(self._fd)
        if self._made:
            try:
                os.unlink(self.path)
            except OSError as e:
                log.debug("removing the timer pipe %s: %s", self.path, e)

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:  # no writer has it open right now
                break
            self._partial += chunk
        *lines, self._partial = self._partial.split(b"\n")
        for line in filter(None, lines):
            self._take(line)

    def _take(self, line: bytes) -> None:
        try:
            r = json.loads(line)
            key = (int(r["pid"]), str(r["scope_id"]))
            at, sig = float(r["expiration_time"]), int(r.get("signal", 0))
        except (ValueError, KeyError, TypeError) as e:  # a stray writer must not stop the watchdog
            log.warning(f"the timer pipe {self.path} got a line that is not a timer request ({e}); ignored")
            return
        if at < 0:
            self._timers.pop(key, None)
        else:
            self._timers[key] = (at, sig)


def end_expired(watchdog: FileTimer, members: Iterable, emit: Callable[..., None]) -> None:
    """Give each running worker (a `members.Member`) whose timer ran out the signal it asked for (SIGKILL
    by default); marked `expired`, its end is then a failure that names the timer's scope."""
    members = list(members)
    for e in watchdog.poll():
        m = next((m for m in members if m.proc.pid == e.pid and m.state is WorkerState.RUNNING), None)
        if m is None or m.signalled:
            log.debug("timer %r of pid %d expired, but that is no running worker of this round", e.scope, e.pid)
            continue
        m.expired = e.scope
        try:
            name = signal.Signals(e.signal).name
        except ValueError:
            name = f"signal {e.signal}"
        log.info(f"rank {m.worker.rank}'s watchdog timer {e.scope!r} expired; ending it with {name}")
        emit("timer_expired", rank=m.worker.rank, pid=e.pid, scope=e.scope, signal=name)
        m.proc.send(e.signal)


def from_environ(environ: Mapping[str, str]) -> FileTimer | None:
    """The watchdog when `TORCHELASTIC_ENABLE_FILE_TIMER=1` (torch's test), on `TORCHELASTIC_TIMER_FILE` or a
    fresh path in the temporary folder; None otherwise."""
    if environ.get(ENABLE_VAR) != "1":
        return None
    # Imported only here: uuid (and platform with it) cost every other launch's start ~3 ms.
    import uuid

    path = environ.get(FILE_VAR) or os.path.join(tempfile.gettempdir(), f"watchdog_timer_{uuid.uuid4()}")
    return FileTimer(path)
