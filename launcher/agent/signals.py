"""Signal capture: handlers only post an event; the supervisor loop does the work."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class SignalReceived:
    signum: int

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


REPEAT_WINDOW = 0.5  # seconds: the same signal again within this is one delivery, not a second Ctrl-C


def once_per_burst(post: Callable[[object], None], window: float = REPEAT_WINDOW) -> Callable[[int, object], None]:
    """A handler that posts each signal once per burst.

    `timeout` signals its child and then its own process group, Slurm the step and the batch
    shell: one intent, two deliveries microseconds apart. A delivery of the same signal within
    `window` seconds of the last one that counted is dropped; a deliberate second Ctrl-C comes
    later than that and still counts.
    """
    last: dict[int, float] = {}

    def handler(signum: int, _frame: object) -> None:
        now = time.monotonic()
        if now - last.get(signum, -window) < window:
            return
        last[signum] = now
        post(SignalReceived(signum))

    return handler


@contextmanager
def capture_signals(signums: Iterable[int], post: Callable[[object], None], wake_fd: int) -> Iterator[None]:
    """Post `SignalReceived` for each of `signums` (once per burst) while inside; restore the old handlers after.

    `wake_fd` becomes the interpreter's wake-up fd, so a signal delivered to another thread
    still wakes the main thread out of `select()` at once.
    """
    if threading.current_thread() is not threading.main_thread():  # tests may drive a supervisor off-main
        yield
        return
    handler = once_per_burst(post)
    previous = {s: signal.signal(s, handler) for s in signums}
    old_fd = signal.set_wakeup_fd(wake_fd, warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        for s, handler in previous.items():
            signal.signal(s, handler)
