"""A clock the test moves: the seam for every `clock=` the launcher takes."""

from __future__ import annotations


class FakeClock:
    """A monotonic clock that moves only when a test moves `now`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move on by `seconds`; the new time."""
        self.now += seconds
        return self.now
