"""The hang clock counts a worker's silence only over the time its agent was running (issue 32).

The agent looks at its workers every `--monitor_interval`. A gap between two looks far beyond that
interval means the agent itself did not run: the node was stopped whole (SIGSTOP of its processes, a
paused VM, a stalled host) and its workers with it, or the agent alone was starved or stopped. Either
way nobody watched the workers then, and a worker frozen beside its agent has not hung: on resume its
silence would read as long as the freeze, and a healthy job would be killed for a blink. So such a gap
is taken out of every silence it overlaps. The price: a real hang that began during a stall of the
agent alone is declared that much later (at most `--hang_timeout` of the agent's running time).
"""

from __future__ import annotations

import logging
from collections import deque

log = logging.getLogger(__name__)

# A gap this much over the monitor interval is a stall of the agent, not a slow look: a loaded
# scheduler delays a look by tenths, a stopped node by seconds.
STALL_SLACK = 1.0


class AwakeClock:
    """The agent's own stalls, from the gaps between its looks, on the supervisor's clock."""

    def __init__(self, interval: float, keep: int = 64):
        self.stall = interval + STALL_SLACK
        self._last: float | None = None
        self._stalls: deque[tuple[float, float]] = deque(maxlen=keep)  # (last look before, first look after)

    def tick(self, now: float) -> float | None:
        """Note one look at `now`: the length of the stall it ends, or None."""
        last, self._last = self._last, now
        if last is None or now - last <= self.stall:
            return None
        self._stalls.append((last, now))
        log.debug(f"the agent did not run for {now - last:.1f} s (stopped or starved); not counted in any hang")
        return now - last

    def stalled(self, since: float, now: float) -> float:
        """Seconds of [since, now] the agent spent stalled."""
        return sum(max(0.0, min(end, now) - max(begin, since)) for begin, end in self._stalls)

    def silence(self, idle: float, now: float) -> float:
        """A worker's `idle` seconds up to `now`, less the agent's stalls within them."""
        return max(0.0, idle - self.stalled(now - idle, now))
