"""Goodput, accounted: a node's wall time split into what trained and what was lost (pure: the
caller passes every time; tests inject them).

The components, which sum to the wall time:

- `training`: workers ran and made progress (from every rank's first step of a round to its end).
- `startup`: the first round, from the moment it formed (its workers being started: a preloaded
  interpreter's imports) to every rank's first step (their imports, loading).
- `rendezvous`: forming rounds and waiting for nodes: the first round until it formed, a membership
  change (a node joined or left: not charged to the restart budget) up to every rank's first step
  again, and the wait for the other nodes at the end.
- `restart`: a failure (here, or a failed worker on another node: the next round's restart count
  rose) until every rank's first step in the next round.
- `redone`: training time spent repeating steps after a restart: (the step reached before the
  failure - the step resumed from) / the step rate before the failure, taken from the training that
  follows the restart. Needs `launcher.progress(step=)`; without steps it is 0 and said unknown.
- `stall`: a hang: the silence --hang_timeout measured before it declared the rank hung, taken from
  training. Stragglers are counted apart (`straggler_steps`: the steps a flagged rank fell behind the
  job's median while flagged), not subtracted: whether a slow rank slowed the job depends on how
  the training synchronises, which the launcher cannot see.
- `shutdown`: the end of a job stopped by a signal, closed by another node, or failed for good (a
  failure no restart followed): from then to the node's end.

A spare's standby (it waits while the job is full, for a member to be lost) is capacity held in
reserve, not time the job lost: it is kept apart (`standby`), outside the wall time and every
component. Once the spare is called (its wait turns into a round forming), its time is the job's:
its joining is the recovery from the member lost (restarts, or rendezvous).

Without any `progress(step=)` call in the job the lost time is measured up to the moment each
round's workers' process group formed on the bootstrap store (`group_formed`: their imports and
`init_process_group` are start-up, or restart), or, where the launcher cannot see it form (a group
formed elsewhere, no torch.distributed at all), up to their start. Their time from there counts as
training: an estimate, since it holds what they do before their first step (a checkpoint's load) and
any re-done steps (the line says which).
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
    SHUTDOWN = "shutdown"


LOST = (
    Component.RESTART,
    Component.REDONE,
    Component.RENDEZVOUS,
    Component.STARTUP,
    Component.STALL,
    Component.SHUTDOWN,
)
WORDS = {
    Component.TRAINING: "training",
    Component.STARTUP: "start-up",
    Component.RENDEZVOUS: "rendezvous and waiting",
    Component.RESTART: "restarts",
    Component.REDONE: "re-done steps",
    Component.STALL: "stalls",
    Component.SHUTDOWN: "shutdown",
}
ESTIMATED = (
    "lost time measured to the workers' start; training estimated: it includes their own start-up"
    " and any re-done steps (no launcher.progress(step=))"
)
ESTIMATED_FORMED = (
    "lost time measured to the workers' process group forming; training estimated: it includes what"
    " they do before their first step and any re-done steps (no launcher.progress(step=))"
)


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
    shutdown: float = 0.0
    restarts: int = 0  # the restart count of the last round that ran (as the verdict line says it)
    redone_steps: int = 0
    straggler_steps: float = 0.0
    steps_known: bool = False  # some worker reported steps (else redone is unknown, not 0)
    formed_known: bool = False  # without steps: the workers' group was seen forming (the lost time ends there)
    # A live figure (the job runs) whose open span may still move: a round's workers run and their first
    # step (or their group forming) is awaited, which turns the time booked as training meanwhile into
    # start-up or restart. Never so for a node's final figure.
    provisional: bool = False
    nodes: int = 1
    standby: float = 0.0  # seconds a spare stood by, apart: outside `wall` (a job's: summed over its nodes)

    @property
    def goodput(self) -> float:
        """The fraction of the wall time that trained (1.0 for no time at all)."""
        return self.training / self.wall if self.wall > 0 else 1.0

    def seconds(self, c: Component) -> float:
        return getattr(self, c.value)

    def rounded(self) -> Breakdown:
        rounded = {c.value: round(self.seconds(c), 3) for c in Component}
        return replace(self, **rounded, wall=round(self.wall, 3), standby=round(self.standby, 3))

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
        """`goodput 97.1 % of 3 h 12 m: restarts 4 m (2), ...` (the lost components, largest first).

        A component is named once it is 0.05 s or 0.5 % of the wall time: those left out sum to under
        3 % of it, so the figure and the parts named account for the wall time (a job of 0.1 s, whose
        parts are all under 0.05 s, names them). "nothing lost" only when nothing was."""
        least = min(0.05, 0.005 * self.wall)
        shown = [c for c in LOST if self.seconds(c) >= least or (c is Component.RESTART and self.restarts)]
        lost = sorted(shown, key=self.seconds, reverse=True)  # the restart count always, as the verdict says it
        parts = []
        for c in lost:
            text = f"{WORDS[c]} {duration(self.seconds(c))}"
            if c is Component.RESTART and self.restarts:
                text += f" ({self.restarts})"
            if c is Component.REDONE:
                text += f" ({self.redone_steps} step{'' if self.redone_steps == 1 else 's'})"
            parts.append(text)
        if self.straggler_steps >= 1:
            parts.append(f"stragglers {self.straggler_steps:.0f} steps behind the median")
        where = f" {scope}" if scope else ""
        how = "" if self.steps_known else f"; {ESTIMATED_FORMED if self.formed_known else ESTIMATED}"
        lost = sum(self.seconds(c) for c in LOST)
        rest = "nothing lost" if lost <= 0 else f"{duration(lost)} lost in all"
        return (
            f"goodput{where} {100 * self.goodput:.1f} % of {duration(self.wall)}: "
            + (", ".join(parts) or rest)
            + (f"; {standing_by(self.standby)}" if self.standby >= 0.05 else "")
            + how
        )


def standing_by(seconds: float) -> str:
    """How a spare's standby is said: apart from the figure."""
    return f"spare standing by {duration(seconds)} apart (capacity in reserve, not the job's time)"


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
        formed_known=any(p.formed_known for p in parts),
        provisional=any(p.provisional for p in parts),
        nodes=n,
        standby=sum(p.standby for p in parts),
    )


def duration(seconds: float) -> str:
    """3 h 12 m, 4 m 5 s, 12.3 s, 27 ms."""
    s = max(0.0, seconds)
    if s < 0.1:
        return f"{1000 * s:.0f} ms"
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
    END = "end"  # this node's workers all succeeded: waiting for the others
    SHUTDOWN = "shutdown"  # a signal, or the job closed: until the end


class _Phase(enum.Enum):
    FORMING = "forming"  # asking the rendezvous for a round
    STARTING = "starting"  # the round formed: its workers are being started (the preload interpreter, a backoff)
    RUNNING = "running"  # its workers run (in a window: each rank's first step is awaited)
    STOPPED = "stopped"  # the workers are being stopped, or are gone


@dataclass
class _Round:
    """The current round's step facts."""

    ranks: frozenset[int]
    started: float
    first: dict  # rank -> (step, at) of its first report this round
    last: dict  # rank -> (step, at) of its latest report this round
    # Its ranks ran before it (in place, the survivors of a node where nothing started): a report counts
    # only once written after the round began, not within the second before it that a new worker's may be.
    went_on: bool = False


class Ledger:
    """Feed it what the node does, in time order; `breakdown(now)` any time (from one thread).

    The open span (since the last fact) is booked when it closes, by the window and phase it closes
    in: a round whose workers run before any step was seen in the job counts as training then, and
    as start-up or restart once a step shows the job reports them."""

    def __init__(self, now: float):
        self.began = now
        self.acc = dict.fromkeys(Component, 0.0)
        self.since = now  # when the current span began
        self.window: _Window | None = _Window.FIRST  # None: training
        self.phase = _Phase.FORMING
        self.round: _Round | None = None
        self.ended: float | None = None
        self.restarts = 0  # the restart count of the last round that ran (what the verdict line says)
        self.redone_steps = 0
        self.redo_debt = 0.0  # seconds of the coming training that repeat steps
        self.resume_from: int | None = None  # the step reached before the last failure
        self.rate_before = 0.0  # steps/s before the last failure
        self.steps_known = False
        self.formed_known = False  # a round's workers' group was seen forming (without steps: where the window ends)
        self.straggler_steps = 0.0
        self._last_restart_count = 0
        self._in_window = dict.fromkeys(Component, 0.0)  # seconds booked since the open window opened
        self.standby_s = 0.0  # a spare's standby, ended
        self._standby_since: float | None = None  # a spare stands by from then (nothing is booked meanwhile)
        self._ran = False  # a round of this node's ran

    @property
    def awaiting_first_steps(self) -> bool:
        """A round runs whose ranks have not all made their first step (read the steps often now)."""
        return self.window is not None and self.phase is _Phase.RUNNING and self.round is not None

    # ------------------------------------------------------------------ facts

    def rendezvous(self, now: float, membership: bool = False) -> None:
        """A new round is asked for (the stop before it was seen by `failure` or `membership`)."""
        self._close_span(now)
        if self.window is None:  # no stop seen first (not expected)
            self._open(_Window.MEMBERSHIP if membership else _Window.FAILURE)
        self.phase = _Phase.FORMING

    def spare(self, now: float) -> None:
        """This node waits as a spare (the job is full): it stands by, apart from the job's time. A node
        that never ran a round stood by from its start (learning it is a spare is part of its wait)."""
        if self._standby_since is not None or self.phase is not _Phase.FORMING or self.ended is not None:
            return
        if not self._ran and self.window is _Window.FIRST:
            self.acc = dict.fromkeys(Component, 0.0)
            self._in_window = dict.fromkeys(Component, 0.0)
            self._standby_since = self.began
        else:
            self._close_span(now)
            self._standby_since = now

    def called(self, now: float) -> None:
        """A spare's standby ends (its wait turned into a round forming): from here its time is the job's,
        and, for a node that ran no round yet, its joining is the job's recovery from the member lost
        (a membership window: a restart once the round's restart count says the loss was charged)."""
        if self._standby_since is None:
            return
        self.standby_s += max(0.0, now - self._standby_since)
        self._standby_since = None
        self.since = max(self.since, now)
        if not self._ran and self.window is _Window.FIRST:
            self._open(_Window.MEMBERSHIP)

    def formed(self, now: float) -> None:
        """The round formed: its workers are being started (a preloaded interpreter's imports are
        waited for here, and a restart's backoff)."""
        self.called(now)
        self._close_span(now)
        self.phase = _Phase.STARTING

    def running(self, now: float, ranks: Iterable[int], restart_count: int, went_on: bool = False) -> None:
        """This node's workers of a new round started (`ranks`); `went_on`: none started here (in place),
        and `ranks` are its survivors, whose first step after the recovery ends the window."""
        self._close_span(now)
        if self.window is _Window.MEMBERSHIP and restart_count > self._last_restart_count:
            self.window = _Window.FAILURE  # a worker failed on another node: charged as a restart
            moved = self._in_window[Component.RENDEZVOUS]
            self.acc[Component.RENDEZVOUS] -= moved
            self.acc[Component.RESTART] += moved
            self._in_window[Component.RENDEZVOUS] -= moved
            self._in_window[Component.RESTART] += moved
        self._last_restart_count = restart_count
        self.restarts = max(self.restarts, restart_count)
        self.phase = _Phase.RUNNING
        self._ran = True
        self.round = _Round(frozenset(ranks), now, {}, {}, went_on)

    def steps(self, now: float, samples: Mapping[int, tuple[int, float]]) -> None:
        """Each rank's latest `progress(step=)` and when it wrote it (the progress file's mtime)."""
        rnd = self.round
        if rnd is None or self.ended is not None:
            return
        for rank, (step, at) in samples.items():
            if rank not in rnd.ranks or at < rnd.started - (0.0 if rnd.went_on else 1.0):
                continue
            self.steps_known = True
            at = min(max(at, rnd.started), now)
            rnd.first.setdefault(rank, (step, at))
            rnd.last[rank] = (step, at)
        if self.awaiting_first_steps and rnd.ranks and set(rnd.first) >= rnd.ranks:
            self._training_begins(max(at for _, at in rnd.first.values()))

    def group_formed(self, at: float) -> None:
        """The running round's workers' process group formed at `at` (all of them, job-wide). Without
        steps in the job, the open window (start-up, a restart, a membership change) ends there: the
        time since the workers' start, booked as training meanwhile, was the window's. With steps, the
        first step ends it (a later, finer point): this is not needed."""
        rnd = self.round
        if self.steps_known or not self.awaiting_first_steps or rnd is None or at < rnd.started:
            return
        self._close_span(max(at, self.since))
        moved = self._in_window[Component.TRAINING]
        to = {_Window.FIRST: Component.STARTUP, _Window.FAILURE: Component.RESTART}.get(
            self.window,  # type: ignore[arg-type]
            Component.RENDEZVOUS,
        )
        self.acc[Component.TRAINING] -= moved
        self.acc[to] += moved
        self.formed_known = True
        self.resume_from = None
        self.window = None

    def finished_rank(self, now: float, rank: int) -> None:
        """A rank of the round exited 0: one that made no step this round (nothing left for it to do) is
        no longer awaited, or the window would stay open until the job's end."""
        rnd = self.round
        if rnd is None or rank in rnd.first or rank not in rnd.ranks:
            return
        rnd.ranks = rnd.ranks - {rank}
        if self.awaiting_first_steps and rnd.ranks and rnd.first and set(rnd.first) >= rnd.ranks:
            self._training_begins(max(at for _, at in rnd.first.values()))

    def failure(self, now: float) -> None:
        """A worker of this node failed (or hung): a restart window opens, unless the workers are
        stopped already."""
        if self._stopped():
            return
        self._close_span(now)
        self._remember_progress()
        self._open(_Window.FAILURE)
        self.phase = _Phase.STOPPED

    def membership(self, now: float) -> None:
        """The group stops because another node joined, left, or failed (a rising restart count says which)."""
        if self._stopped():
            return
        self._close_span(now)
        self._remember_progress()
        self._open(_Window.MEMBERSHIP)
        self.phase = _Phase.STOPPED

    def shutdown(self, now: float) -> None:
        """A signal stops this node, or the job was closed: what follows, to the end, is its shutdown."""
        if self.window is _Window.SHUTDOWN or self.ended is not None:
            return
        if self._standby_since is not None:  # a spare stopped while standing by: its stop is its own
            self.called(now)
        self._close_span(now)
        if self.phase is _Phase.RUNNING:
            self._remember_progress()
        self._open(_Window.SHUTDOWN)
        self.phase = _Phase.STOPPED

    def done(self, now: float) -> None:
        """This node's workers all succeeded: what follows is waiting for the others."""
        if self._stopped():
            return
        self._close_span(now)
        self._open(_Window.END)
        self.phase = _Phase.STOPPED

    def hang(self, now: float, idle: float) -> None:
        """A rank was declared hung after `idle` s of silence: that silence was a stall, not training,
        and a restart window opens."""
        if self._stopped():
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
        """The node ends: a failure no round followed ended the job, and its time was the shutdown."""
        if self.ended is not None:
            return
        if self._standby_since is not None:  # a spare the job finished without: all of it stood by
            self.standby_s += max(0.0, now - self._standby_since)
            self._standby_since = None
            self.since = max(self.since, now)
        self._close_span(now)
        if self.window is _Window.FAILURE and self.phase is not _Phase.RUNNING:
            moved = self._in_window[Component.RESTART]
            self.acc[Component.RESTART] -= moved
            self.acc[Component.SHUTDOWN] += moved
        self.ended = now

    # ------------------------------------------------------------------ results

    def breakdown(self, now: float) -> Breakdown:
        end = self.ended if self.ended is not None else now
        acc = dict(self.acc)
        standby = self.standby_s
        if self._standby_since is not None:
            standby += max(0.0, end - self._standby_since)
        elif self.ended is None:
            for c, s in self._booked(max(0.0, end - self.since)):
                acc[c] += s
        return Breakdown(
            wall=max(0.0, end - self.began - standby),
            standby=standby,
            **{c.value: acc[c] for c in Component},
            restarts=self.restarts,
            redone_steps=self.redone_steps,
            straggler_steps=self.straggler_steps,
            steps_known=self.steps_known,
            formed_known=self.formed_known,
            provisional=self.ended is None and self.awaiting_first_steps,
        )

    # ------------------------------------------------------------------ spans

    def _booked(self, span: float) -> list[tuple[Component, float]]:
        """How the open span splits into components, by the window and phase it is in."""
        w, p = self.window, self.phase
        if w is None:
            redo = min(span, self.redo_debt)
            return [(Component.REDONE, redo), (Component.TRAINING, span - redo)]
        if w is _Window.SHUTDOWN:
            return [(Component.SHUTDOWN, span)]
        if w is _Window.END:
            return [(Component.RENDEZVOUS, span)]
        if p is _Phase.RUNNING and not self.steps_known:
            # no step seen in the job yet: the workers' time from their start counts as training
            # (estimated: it holds their own start-up, which only progress(step=) can tell apart)
            return [(Component.TRAINING, span)]
        if w is _Window.FAILURE:
            return [(Component.RESTART, span)]
        if w is _Window.FIRST and p is not _Phase.FORMING:
            return [(Component.STARTUP, span)]
        return [(Component.RENDEZVOUS, span)]

    def _open(self, window: _Window) -> None:
        self.window = window
        self._in_window = dict.fromkeys(Component, 0.0)

    def _stopped(self) -> bool:
        """The workers are stopped already (a window open, and no round running in it)."""
        return self.ended is not None or (self.window is not None and self.phase is not _Phase.RUNNING)

    def _close_span(self, now: float) -> None:
        for c, s in self._booked(max(0.0, now - self.since)):
            self.acc[c] += s
            self._in_window[c] += s
            if c is Component.REDONE:
                self.redo_debt -= s
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
