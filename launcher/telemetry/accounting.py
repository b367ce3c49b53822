"""The agent's goodput accountant: it hears the supervisor's events (a sink), reads the workers'
`launcher.progress(step=)` files now and then, keeps a `goodput.Ledger`, and at the end agrees on
the job-wide figure with the other nodes through the rendezvous store.

The job-wide figure: every node publishes its final breakdown under the last round's prefix
(`r<r>/goodput<g>`); the node of group rank 0 waits (bounded) for every member's, sums them
(`goodput.total`: node-seconds, so a node that ran longer weighs more) and publishes the job's
(`r<r>/goodput`); the others wait (bounded) for it. One node computes it, so every node prints the
same figure whatever order they end in; the facts it sums are each node's own, measured on its own
clock (no cross-host clock comparison). A node that cannot get it within JOB_WAIT prints its own
figure and says so. A spare's standby is outside every node's wall time (`goodput.Ledger.spare`):
the job's figure is its members' time, and the standby of the spares that took over is said apart.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable

from ..rendezvous.records import load
from ..rendezvous.rerun import job_keys
from ..rendezvous.store import Store
from .goodput import Breakdown, Ledger, duration, standing_by, total

log = logging.getLogger(__name__)
STEPS_EVERY = 0.5  # seconds between reads of the progress files
JOB_WAIT = 5.0  # seconds a node waits at the end for the others' figures
QUIET_WAIT = 1.0  # ... of which the first are not said

Steps = Callable[[], Iterable[tuple[int, str | None]]]  # (rank, progress file) of this node's live workers


def read_steps(files: Iterable[tuple[int, str | None]]) -> dict[int, tuple[int, float]]:
    """rank -> (last step, when it was written) from the workers' progress files; ranks without one are left out."""
    out = {}
    for rank, path in files:
        if not path:
            continue
        try:
            with open(path, "rb") as f:
                step = int(f.read(64).strip() or b"x")
                at = os.fstat(f.fileno()).st_mtime
        except (OSError, ValueError):
            continue
        out[rank] = (step, at)
    return out


class Accountant:
    """A supervisor sink and periodic check; `breakdown()` is safe from any thread."""

    def __init__(
        self, files: Steps, clock: Callable[[], float] = time.time, formed: Callable[[], float | None] = lambda: None
    ):
        """`files`: this node's workers' progress files; `formed`: when the running round's workers'
        process group formed (on `clock`), None until it has or where it is not seen (agent.bootstrap)."""
        self.files, self.clock, self.formed = files, clock, formed
        self.ledger = Ledger(clock())
        self._lock = threading.Lock()
        self._spawned: set[int] = set()  # the ranks of the round running
        self._new: set[int] = set()  # ... started since its rendezvous (in place: the replacements alone)
        self._succeeded: set[int] = set()
        self._flagged: dict[int, tuple[float, float, float]] = {}  # rank -> (since, rate, median)
        self._next_read = 0.0
        self.round: tuple[int, int, int] | None = None  # (round, group rank, group world size) last run

    def __call__(self, kind: str, fields: dict) -> None:
        with self._lock:
            now, ledger = self.clock(), self.ledger
            if kind == "rendezvous":
                ledger.rendezvous(now, membership=fields.get("cause") == "membership")
                self._new = set()
                if fields.get("cause") != "in_place":  # in place, the survivors run on
                    self._spawned, self._succeeded = set(), set()
            elif kind == "waiting":  # a spare stands by apart; another wait after it: the spare was called
                ledger.spare(now) if fields.get("what") == "spare" else ledger.called(now)
            elif kind == "starting":
                ledger.formed(now)
            elif kind == "spawn":
                self._spawned.add(int(fields["rank"]))
                self._new.add(int(fields["rank"]))
            elif kind == "running":  # the failure window closes once the new ranks step (in place, with
                # none new on this node: once its survivors step again, the recovery over)
                went_on = not self._new
                ledger.running(now, self._new or self._spawned, int(fields.get("restarts", 0)), went_on)
                self.round = (int(fields["round"]), int(fields["group_rank"]), int(fields["group_world_size"]))
            elif kind == "exit":
                self._exit(now, fields)
            elif kind == "stopping":
                ledger.steps(now, read_steps(self.files()))
                reason = fields.get("reason")
                if reason in ("restart", "fail"):
                    ledger.failure(now)
                elif reason in ("signal", "closed"):  # this node ends: the job closed, or a signal stops it
                    ledger.shutdown(now)
                else:  # another node joined, left or failed (the next round's restart count says which)
                    ledger.membership(now)
                self._unflag_all(now)
            elif kind == "signal" and not fields.get("passthrough"):
                ledger.steps(now, read_steps(self.files()))
                ledger.shutdown(now)
            elif kind == "hang":
                ledger.hang(now, float(fields.get("idle", 0.0)))
            elif kind == "straggler":
                self._flagged[int(fields["rank"])] = (now, float(fields["rate"]), float(fields["median"]))
            elif kind == "straggler_cleared":
                self._unflag(now, int(fields["rank"]))

    def _exit(self, now: float, fields: dict) -> None:
        if fields.get("returncode") == 0:
            self._succeeded.add(int(fields["rank"]))
            self.ledger.steps(now, read_steps(self.files()))
            self.ledger.finished_rank(now, int(fields["rank"]))
            if self._spawned and self._succeeded >= self._spawned:
                self.ledger.done(now)
        elif not fields.get("collateral"):
            self.ledger.steps(now, read_steps(self.files()))
            self.ledger.failure(now)

    def _unflag(self, now: float, rank: int) -> None:
        if rank in self._flagged:
            since, rate, median = self._flagged.pop(rank)
            self.ledger.straggling(now - since, rate, median)

    def _unflag_all(self, now: float) -> None:
        for rank in list(self._flagged):
            self._unflag(now, rank)

    def tick(self) -> None:
        """Read the progress files every STEPS_EVERY s (called once per supervisor loop turn); every
        turn while a round's first steps are awaited: the step a round resumed from is its first."""
        now = self.clock()
        if self.ledger.awaiting_first_steps and not self.ledger.steps_known:
            at = self.formed()
            if at is not None:
                with self._lock:
                    self.ledger.group_formed(at)
        if now < self._next_read and not self.ledger.awaiting_first_steps:
            return
        self._next_read = now + STEPS_EVERY
        samples = read_steps(self.files())
        if samples:
            with self._lock:
                self.ledger.steps(now, samples)

    def breakdown(self) -> Breakdown:
        with self._lock:
            return self.ledger.breakdown(self.clock())

    def finish(self) -> Breakdown:
        with self._lock:
            now = self.clock()
            self._unflag_all(now)
            self.ledger.finish(now)
            return self.ledger.breakdown(now)


def job_breakdown(
    store: Store | None, run_id: str, where: tuple[int, int, int] | None, mine: Breakdown, wait: float = JOB_WAIT
) -> tuple[Breakdown | None, str]:
    """The job-wide breakdown agreed through `store` (see the module's docstring), or (None, why not)."""
    if where is None:
        return None, "this node ran no round"
    r, g, n = where
    if store is None or n <= 1:
        return (mine if n <= 1 else None), ("" if n <= 1 else "no shared store")
    try:
        prefix = job_keys(store, run_id).of_round(r)  # in the job's current epoch (`rendezvous.rerun`)
        store.set(f"{prefix}goodput{g}", json.dumps(mine.to_dict()).encode())
        if g == 0:
            parts = [f"{prefix}goodput{i}" for i in range(n)]
            if not _wait(store, parts, wait, "the other nodes' figures"):
                log.info("goodput: not every node's figure came within %g s; the job's counts those that did", wait)
            found = [Breakdown.from_dict(load(raw, "goodput")) for raw in store.multi_get(parts) if raw]
            raw = json.dumps(total(b for b in found if b is not None).to_dict()).encode()
            store.set(f"{prefix}goodput", raw)
            return Breakdown.from_dict(json.loads(raw)), ""  # as the others read it, to the last digit
        if not _wait(store, [f"{prefix}goodput"], wait, "the job's figure from the node of group rank 0"):
            return None, f"the job's figure did not come from group rank 0 within {wait:g} s"
        job = Breakdown.from_dict(load(store.get(f"{prefix}goodput"), "goodput"))
        return job, "" if job else "group rank 0 published a malformed figure"
    except Exception as e:  # the store host may be gone at the end of a failed job: the node's figure stands
        log.debug("the job-wide goodput exchange failed", exc_info=True)
        return None, f"the store could not be read ({type(e).__name__})"


def _wait(store: Store, keys: list[str], wait: float, what: str) -> bool:
    """Wait for `keys`; past QUIET_WAIT s, say so (nodes of a job usually end within it)."""
    if store.wait(keys, min(wait, QUIET_WAIT)):
        return True
    log.info(f"goodput: waiting up to {wait - QUIET_WAIT:g} s more for {what}")
    return store.wait(keys, max(0.0, wait - QUIET_WAIT))


def goodput_line(node: Breakdown, job: Breakdown | None, why: str = "") -> str:
    """The node's last line: the job-wide figure (the same on every node), this node's beside it."""
    if job is not None and job.nodes > 1:
        return f"{job.line()} (job-wide, {job.nodes} nodes; this node {100 * node.goodput:.1f} %)"
    if job is None and why:
        return f"{node.line()} (this node; the job's figure is unknown: {why})"
    return node.line()


def conclude(
    accountant: Accountant,
    store: Store | None,
    run_id: str,
    host: str,
    emit: Callable[..., None],
    leaves: str = "",
) -> str:
    """At the end, before leaving the rendezvous: the node's and the job's breakdowns, into the
    events file (`goodput`); returns the line to print last. `leaves`: why this node leaves a job that
    may go on without it (quarantined, stopped by a signal): no job-wide figure to agree on."""
    node = accountant.finish().rounded()  # the line from the figures the events file gets
    if leaves:
        # The others re-form once this node has left (after this): a wait here for group rank 0's
        # figure would only hold them in a round they no longer have, for JOB_WAIT.
        job, why = None, f"this node left the job ({leaves}), which may go on without it"
    else:
        # Over the rendezvous' own connection, idle by now (its watcher has its own): a new one to torch's
        # server (no boot id to tell a gone store by) waits out the connect timeout when the store's host
        # is gone; this one gives up within the store client's reconnect bound.
        job, why = job_breakdown(store, run_id, accountant.round, node)
    emit("goodput", host=host, node=node.to_dict(), job=job.to_dict() if job else None, why=why)
    if accountant.round is None:  # stopped while forming, or a spare that was never needed
        if node.standby >= 0.05:
            return f"goodput: this node ran no round: {standing_by(node.standby)}"
        return f"goodput: this node ran no round ({duration(node.wall)} waiting for one)"
    return goodput_line(node, job, why)
