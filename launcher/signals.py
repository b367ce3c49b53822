"""Signal capture: handlers only post an event; the supervisor loop does the work."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator


@dataclass(frozen=True)
class SignalReceived:
    signum: int

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


@contextmanager
def capture_signals(signums: Iterable[int], post: Callable[[object], None], wake_fd: int) -> Iterator[None]:
    """Post `SignalReceived` for each of `signums` while inside; restore the old handlers after.

    `wake_fd` becomes the interpreter's wake-up fd, so a signal delivered to another thread
    still wakes the main thread out of `select()` at once.
    """
    if threading.current_thread() is not threading.main_thread():  # tests may drive a supervisor off-main
        yield
        return
    previous = {s: signal.signal(s, lambda signum, _frame: post(SignalReceived(signum))) for s in signums}
    old_fd = signal.set_wakeup_fd(wake_fd, warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        for s, handler in previous.items():
            signal.signal(s, handler)
