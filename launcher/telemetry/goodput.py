"""Goodput, accounted: a node's wall time split into what trained and what was lost (pure: the
caller passes every time; tests inject them).

The components, which sum to the wall time:

- `training`: workers ran and made progress (from every rank's first step of a round to its end).
- `startup`: the first round, from its workers' start to every rank's first step (imports, loading).
- `rendezvous`: forming rounds and waiting for nodes: the first round, a membership change (a node
  joined or left: not charged to the restart budget) up to every rank's first step again, and the
  wait for the other nodes at the end.
- `restart`: a failure (here, or a failed worker on another node: the next round's restart count
  rose) until every rank's first step in the next round; a failure that ends the job, until its end.
- `redone`: training time spent repeating steps after a restart: (the step reached before the
  failure - the step resumed from) / the step rate before the failure, taken from the training that
  follows the restart. Needs `launcher.progress(step=)`; without steps it is 0 and said unknown.
- `stall`: a hang: the silence --hang_timeout measured before it declared the rank hung, taken from
  training. Stragglers are counted apart (`straggler_steps`: the steps a flagged rank fell behind the
  job's median while flagged), not subtracted: whether a slow rank slowed the job depends on how
  the training synchronises, which the launcher cannot see.

Without any `progress(step=)` call in the job, a round's time from its workers' start counts as
training (the launcher cannot tell loading from training).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace


class Component(enum.Enum):
    TRAINING = "training"
    STARTUP = "startup"
    RENDEZVOUS = "rendezvous"
    RESTART = "restart"
    REDONE = "redone"
    STALL = "stall"


LOST = (Component.RESTART, Component.REDONE, Component.RENDEZVOUS, Component.STARTUP, Component.STALL)
WORDS = {
    Component.TRAINING: "training",
    Component.STARTUP: "start-up",
    Component.RENDEZVOUS: "rendezvous and waiting",
    Component.RESTART: "restarts",
    Component.REDONE: "re-done steps",
    Component.STALL: "stalls",
}


@dataclass(frozen=True)
class Breakdown:
    """Seconds per component (they sum to `wall`), with the counts behind them. A job's breakdown is
    the mean over its `nodes` (node-seconds / nodes), so its goodput is its machine time's."""

    wall: float = 0.0
    training: float = 0.0
    startup: float = 0.0
    rendezvous: float = 0.0
    restart: float = 0.0
    redone: float = 0.0
    stall: float = 0.0
    restarts: int = 0  # failures that cost a restart window (this node's view)
    redone_steps: int = 0
    straggler_steps: float = 0.0
    steps_known: bool = False  # some worker reported steps (else redone is unknown, not 0)
    nodes: int = 1

    @property
    def goodput(self) -> float:
        """The fraction of the wall time that trained (1.0 for no time at all)."""
        return self.training / self.wall if self.wall > 0 else 1.0

    def seconds(self, c: Component) -> float:
        return getattr(self, c.value)

    def rounded(self) -> Breakdown:
        return replace(self, **{c.value: round(self.seconds(c), 3) for c in Component}, wall=round(self.wall, 3))

    def to_dict(self) -> dict:
        r = self.rounded()  # the fraction from the figures as written, so a reader finds the same
        return {**asdict(r), "goodput": round(r.goodput, 5)}

    @classmethod
    def from_dict(cls, value: object) -> Breakdown | None:
        """A breakdown read back (the store, an events file), checked; None when malformed."""
        if not isinstance(value, dict):
            return None
        out = {}
        for f in fields(cls):
            v = value.get(f.name)
            if v is None:
                continue
            if f.type == "bool":
                if type(v) is not bool:
                    return None
            elif f.type == "int":
                if type(v) is not int or not 0 <= v < 1 << 40:
                    return None
            elif type(v) not in (int, float) or not math.isfinite(v) or not 0 <= v < 1e12:
                return None
            out[f.name] = v
        return cls(**out)

    def line(self, scope: str = "") -> str:
        """`goodput 97.1 % of 3 h 12 m: restarts 4 m (2), ...` (the lost components, largest first)."""
        lost = sorted((c for c in LOST if self.seconds(c) >= 0.05), key=self.seconds, reverse=True)
        parts = []
        for c in lost:
            text = f"{WORDS[c]} {duration(self.seconds(c))}"
            if c is Component.RESTART and self.restarts:
                text += f" ({self.restarts})"
            if c is Component.REDONE:
                text += f" ({self.redone_steps} steps)"
            parts.append(text)
        if not self.steps_known:
            parts.append("re-done steps unknown (no launcher.progress(step=))")
        if self.straggler_steps >= 1:
            parts.append(f"stragglers {self.straggler_steps:.0f} steps behind the median")
        where = f" {scope}" if scope else ""
        return f"goodput{where} {100 * self.goodput:.1f} % of {duration(self.wall)}: " + (
            ", ".join(parts) or "nothing lost"
        )


def total(parts: Iterable[Breakdown]) -> Breakdown:
    """The job's breakdown from its nodes': node-seconds summed, divided by the number of nodes."""
    parts = list(parts)
    n = sum(p.nodes for p in parts)
    if not n:
        return Breakdown(nodes=0)
    mean = {c.value: sum(p.seconds(c) * p.nodes for p in parts) / n for c in Component}
    return Breakdown(
        wall=sum(p.wall * p.nodes for p in parts) / n,
        **mean,
        restarts=max(p.restarts for p in parts),
        redone_steps=max(p.redone_steps for p in parts),
        straggler_steps=sum(p.straggler_steps for p in parts),
        steps_known=any(p.steps_known for p in parts),
        nodes=n,
    )


def duration(seconds: float) -> str:
    """3 h 12 m, 4 m 5 s, 12.3 s."""
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f} s"
    m = int(s // 60)
    if m < 60:
        return f"{m} m {int(s % 60)} s"
    return f"{m // 60} h {m % 60} m"


class _Window(enum.Enum):
    FIRST = "first"  # the job's first round: rendezvous, then start-up
    MEMBERSHIP = "membership"  # a node joined or left
    FAILURE = "failure"  # a worker failed: a restart


@dataclass
class _Round:
    """The current round's step facts."""

    ranks: frozenset[int]
    started: float
    first: dict  # rank -> (step, at) of its first report this round
    last: dict  # rank -> (step, at) of its latest report this round


class Ledger:
    """Feed it what the node does, in time order; `breakdown(now)` any time (from one thread)."""

    def __init__(self, now: float):
        self.began = now
        self.acc = dict.fromkeys(Component, 0.0)
        self.since = now  # when the current span began
        self.window: _Window | None = _Window.FIRST  # None: training
        self.forming = True  # in a window: still before this round's workers run
        self.round: _Round | None = None
        self.ended: float | None = None
        self.restarts = 0
        self.redone_steps = 0
        self.redo_debt = 0.0  # seconds of the coming training that repeat steps
        self.resume_from: int | None = None  # the step reached before the last failure
        self.rate_before = 0.0  # steps/s before the last failure
        self.steps_known = False
        self.straggler_steps = 0.0
        self._last_restart_count = 0
        self._window_rendezvous = 0.0  # rendezvous seconds of the open membership window

    @property
    def awaiting_first_steps(self) -> bool:
        """A round runs whose ranks have not all made their first step (read the steps often now)."""
        return self.window is not None and not self.forming and self.round is not None

    # ------------------------------------------------------------------ facts

    def rendezvous(self, now: float, membership: bool = False) -> None:
        """A new round is asked for (the stop before it was seen by `failure` or `membership`)."""
        if self.window is None:  # no stop seen first (not expected): count it as a membership change
            self._close_span(now)
            self.window = _Window.MEMBERSHIP if membership else _Window.FAILURE
        self.forming = True

    def running(self, now: float, ranks: Iterable[int], restart_count: int) -> None:
        """This node's workers of a new round started."""
        self._close_span(now)
        if self.window is _Window.MEMBERSHIP and restart_count > self._last_restart_count:
            self.window = _Window.FAILURE  # a worker failed on another node: charged as a restart
            self.restarts += 1
            self.acc[Component.RENDEZVOUS] -= self._window_rendezvous
            self.acc[Component.RESTART] += self._window_rendezvous
        self._last_restart_count = restart_count
        self.forming = False
        self.round = _Round(frozenset(ranks), now, {}, {})

    def steps(self, now: float, samples: Mapping[int, tuple[int, float]]) -> None:
        """Each rank's latest `progress(step=)` and when it wrote it (the progress file's mtime)."""
        rnd = self.round
        if rnd is None or self.ended is not None:
            return
        for rank, (step, at) in samples.items():
            if rank not in rnd.ranks or at < rnd.started - 1.0:
                continue
            self.steps_known = True
            at = min(max(at, rnd.started), now)
            rnd.first.setdefault(rank, (step, at))
            rnd.last[rank] = (step, at)
        if self.window is not None and not self.forming and rnd.ranks and set(rnd.first) >= rnd.ranks:
            self._training_begins(max(at for _, at in rnd.first.values()))

    def failure(self, now: float) -> None:
        """A worker of this node failed (or hung): a restart window opens, unless one is open."""
        if self.window is _Window.FAILURE:
            return
        self._close_span(now)
        self._remember_progress()
        self.restarts += 1
        self.window = _Window.FAILURE

    def membership(self, now: float) -> None:
        """The group stops because another node joined, left, or failed (a rising restart count says which)."""
        if self._stopped():
            return
        self._close_span(now)
        self._remember_progress()
        self.window = _Window.MEMBERSHIP
        self._window_rendezvous = 0.0

    def done(self, now: float) -> None:
        """This node's workers all succeeded: what follows is waiting for the others."""
        if self._stopped():
            return
        self._close_span(now)
        self.window, self.forming = _Window.MEMBERSHIP, True

    def hang(self, now: float, idle: float) -> None:
        """A rank was declared hung after `idle` s of silence: that silence was a stall, not training,
        and a restart window opens."""
        if self.window is not None:
            return
        self._close_span(now)
        moved = min(idle, self.acc[Component.TRAINING])
        self.acc[Component.TRAINING] -= moved
        self.acc[Component.STALL] += moved
        self.failure(now)  # the hung rank is aborted: the group restarts from here

    def straggling(self, seconds: float, rate: float, median: float) -> None:
        """A flagged rank ran at `rate` against the job's `median` for `seconds`: steps it fell behind."""
        if median > rate >= 0 and seconds > 0:
            self.straggler_steps += (median - rate) * seconds

    def finish(self, now: float) -> None:
        self._close_span(now)
        self.ended = now

    # ------------------------------------------------------------------ results

    def breakdown(self, now: float) -> Breakdown:
        end = self.ended if self.ended is not None else now
        acc = dict(self.acc)
        if self.ended is None:
            span, where = self._span(end)
            for c, s in where(span):
                acc[c] += s
        return Breakdown(
            wall=max(0.0, end - self.began),
            **{c.value: acc[c] for c in Component},
            restarts=self.restarts,
            redone_steps=self.redone_steps,
            straggler_steps=self.straggler_steps,
            steps_known=self.steps_known,
        )

    # ------------------------------------------------------------------ spans

    def _span(self, now: float):
        """The open span's length and how it splits into components."""
        span = max(0.0, now - self.since)
        w = self.window
        if w is None:

            def where(s: float):
                redo = min(s, self.redo_debt)
                return [(Component.REDONE, redo), (Component.TRAINING, s - redo)]

        elif w is _Window.FAILURE:

            def where(s: float):
                return [(Component.RESTART, s)]

        elif not self.forming and not self.steps_known:
            # no step seen in the job yet: a round's time once its workers run counts as training
            def where(s: float):
                return [(Component.TRAINING, s)]

        elif w is _Window.FIRST and not self.forming:

            def where(s: float):
                return [(Component.STARTUP, s)]

        else:

            def where(s: float):
                return [(Component.RENDEZVOUS, s)]

        return span, where

    def _stopped(self) -> bool:
        """The workers are stopped already (a restart window, or no round running)."""
        return self.window is _Window.FAILURE or (self.window is not None and self.forming)

    def _close_span(self, now: float) -> None:
        span, where = self._span(now)
        for c, s in where(span):
            self.acc[c] += s
            if c is Component.REDONE:
                self.redo_debt -= s
            if c is Component.RENDEZVOUS and self.window is _Window.MEMBERSHIP:
                self._window_rendezvous += s
        self.since = max(self.since, now)

    def _training_begins(self, at: float) -> None:
        """Every rank of the round made its first step at `at`: the window closes there."""
        self._close_span(at)
        if self.window is _Window.FAILURE and self.resume_from is not None:
            rnd = self.round
            first = min(step for step, _ in rnd.first.values())  # type: ignore[union-attr]
            redone = max(0, self.resume_from - first + 1)
            self.redone_steps += redone
            self.redo_debt += redone / self.rate_before if self.rate_before > 0 else 0.0
        self.resume_from = None
        self.window = None

    def _remember_progress(self) -> None:
        """At a stop: the furthest step this round reached, and the rate it got there at."""
        rnd = self.round
        if rnd is None or not rnd.last:
            self.round = None
            return
        step, at = max(rnd.last.values())
        rank = max(rnd.last, key=lambda r: rnd.last[r])
        first_step, first_at = rnd.first[rank]
        if at - first_at > 0 and step > first_step:
            self.rate_before = (step - first_step) / (at - first_at)
        self.resume_from = step if self.resume_from is None else max(step, self.resume_from)
        self.round = None  # its steps are history: the next round's come after `running`
