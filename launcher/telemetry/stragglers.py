"""Stragglers: a rank whose step rate stays below a fraction of the job's median for a sustained
period. Pure, and the job's one judge: the board's monitor on the node with group rank 0 (or on the
only node, without a store) feeds it every rate of the job each report interval and publishes what
it flags; every node shows its own flagged ranks. Flag only: nothing is killed or restarted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

TYPE_CHECKING = False  # not typing's: typing's import costs a launch's start ~4 ms
if TYPE_CHECKING:
    from .reports import NodeReport


@dataclass(frozen=True)
class Flagged:
    """What the judge decided: the job's median rate and the flagged ranks with their rates. Also the
    event the board's monitor posts to the supervisor when the flagged ranks change."""

    median: float
    ranks: dict[int, float]


def running_rates(reports: Iterable[NodeReport | None]) -> dict[int, float]:
    """rank -> steps/s of every running worker with a known rate, from nodes' reports."""
    return {
        w.rank: float(w.rate)
        for report in reports
        if report is not None
        for w in report.workers
        if w.state == "running" and w.rate is not None
    }


class Judge:
    """Flags ranks below `threshold` × the median step rate for `period` seconds; 0 turns it off."""

    def __init__(self, threshold: float, period: float):
        self.threshold, self.period = threshold, period
        self._below_since: dict[int, float] = {}

    def __call__(self, rates: dict[int, float], now: float) -> Flagged | None:
        """`rates`: rank -> steps/s of the ranks whose rate is known. None when no judgement can be made
        (off, fewer than 3 ranks with a rate, or a median of 0)."""
        if not self.threshold or len(rates) < 3:
            return None
        from statistics import median as median_of  # here, not at the agent's start-up: ~3 ms of imports

        median = median_of(rates.values())
        if median <= 0:
            return None
        slow = {rank for rank, rate in rates.items() if rate < self.threshold * median}
        self._below_since = {rank: self._below_since.get(rank, now) for rank in slow}
        flagged = {rank: rates[rank] for rank, since in self._below_since.items() if now - since >= self.period}
        return Flagged(median, flagged)
