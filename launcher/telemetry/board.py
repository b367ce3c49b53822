"""The job board: what the nodes tell each other and `launcher status` beside the rendezvous, kept
in the same store under the same round's prefix, driven from the agent.

- `Board`: the records. Each node's `NodeReport` under `r<r>/snap<g>` (one key per node: O(N)
  store writes per interval), and the stragglers flagged in round r under `r<r>/stragglers`.
- `Monitor`: the agent's thread. Every REPORT_EVERY s while a round runs it publishes this node's
  report; the node with group rank 0 judges stragglers over every report (O(N) reads, one write)
  and every node reads the list (one get), posting `Flagged` to the supervisor when its flagged
  ranks change. Without a store (`local`, `static`) it judges this node's ranks alone. It never
  fails the job: a store error is logged and tried again at the next interval.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from ..errors import RendezvousError
from ..net import hostname
from ..rendezvous.keys import Keys
from ..rendezvous.records import load, number
from ..rendezvous.rerun import job_keys
from ..rendezvous.store import Capability, DeletingStore, Store, capabilities_of
from ..spec import Round
from .reports import NodeReport
from .stragglers import Flagged, Judge, running_rates

log = logging.getLogger(__name__)
REPORT_EVERY = 2.0  # seconds between a node's reports
RETRY_EVERY = 0.5  # seconds until the next look while this node's workers are still starting


REPORT_BATCH = 1024  # reports read per MULTI_GET


class Board:
    """The job board of run `run_id` over `store` (a connection of its own: one thread uses it)."""

    def __init__(self, store: Store, run_id: str, keys: Keys | None = None):
        self.store = store
        self.keys = keys or job_keys(store, run_id)  # in the job's current epoch (`rendezvous.rerun`)

    def report_key(self, r: int, g: int) -> str:
        return f"{self.keys.of_round(r)}snap{g}"

    def stragglers_key(self, r: int) -> str:
        return f"{self.keys.of_round(r)}stragglers"

    def publish(self, r: int, report: NodeReport) -> None:
        """This node's report in round r, under its group rank."""
        self.store.set(self.report_key(r, report.group_rank), report.encode())

    def reports(self, r: int, members: int) -> list[NodeReport | None]:
        """Every member's last report in round r (None where a node has published none, or a bad one).

        Read a batch at a time; a batch with none ends the read, so a hostile member count
        (999999999) costs one batch, not a billion reads (group ranks are dense: a real round's
        reports are all there, or all but a few of a round that just formed)."""
        raws: list[bytes | None] = []
        for start in range(0, members, REPORT_BATCH):
            keys = [self.report_key(r, g) for g in range(start, min(members, start + REPORT_BATCH))]
            batch = [raw or None for raw in self.store.multi_get(keys)]
            if not any(batch):
                break
            raws.extend(batch)
        return [NodeReport.decode(raw) for raw in raws]

    def flag(self, r: int, flagged: Flagged) -> None:
        """The judge's decision for round r."""
        ranks = {str(rank): rate for rank, rate in flagged.ranks.items()}
        self.store.set(self.stragglers_key(r), json.dumps({"median": flagged.median, "ranks": ranks}).encode())

    def flagged(self, r: int) -> Flagged | None:
        """The ranks flagged in round r; none yet is an empty list; a malformed list is None."""
        raw = self.store.get(self.stragglers_key(r))
        if raw is None:
            return Flagged(0.0, {})
        try:
            value = load(raw, "straggler list")
            ranks = {int(k): float(v) for k, v in value["ranks"].items() if k.isdigit() and len(k) <= 9 and number(v)}
            median = float(value["median"]) if number(value["median"]) else 0.0
        except (RendezvousError, KeyError, AttributeError, TypeError):
            return None
        return Flagged(median, ranks)

    def forget(self, old: Sequence[tuple[int, int]]) -> None:
        """Delete these (round, group rank) reports where the store can: a long job keeps O(1) per node."""
        if old and Capability.DELETE in capabilities_of(self.store):
            store: DeletingStore = self.store  # type: ignore[assignment]  # (its capabilities say so)
            store.delete([self.report_key(r, g) for r, g in old])

    def close(self) -> None:
        self.store.close()


class Monitor:
    """This agent's side of the board: report, judge, and post `Flagged` while rounds run.

    `store`: the rendezvous store (cloned once for this thread), or None without one. `clock` paces
    the judge; `wall` stamps the reports (`launcher status` shows their age); `background`: ticked by
    a thread of its own (else by whoever calls `tick()`)."""

    def __init__(
        self,
        store: Store | None,
        run_id: str,
        judge: Judge,
        *,
        node_id: str = "",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        annotate: Callable[[NodeReport], NodeReport] = lambda report: report,
        background: bool = True,
    ):
        self._store, self.run_id, self.judge = store, run_id, judge
        self.node_id = node_id or f"{hostname()}:{os.getpid()}"
        self.clock, self.wall = clock, wall
        self.annotate = annotate  # adds what other modules report beside the supervisor (goodput)
        self.background = background  # False: no thread, the caller calls `tick()` (tests)
        self.board: Board | None = None
        self._round: Round | None = None
        self._report: Callable[[], NodeReport | None] = lambda: None
        self._post: Callable[[object], None] = lambda event: None
        self._shown: frozenset[int] = frozenset()  # the flagged ranks last posted
        self._published: list[tuple[int, int]] = []  # (round, group rank) of this node's reports, to forget
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def idle(self) -> bool:
        """Nothing to do: no store to report to and no judge."""
        return self._store is None and not self.judge.threshold

    def begin(self, rnd: Round, report: Callable[[], NodeReport | None], post: Callable[[object], None]) -> None:
        """Round `rnd` runs: report `report()` (None while its workers start) and post to `post`."""
        with self._lock:
            self._round, self._report, self._post, self._shown = rnd, report, post, frozenset()
        if self._thread is None and self.background and not self.idle:
            self._thread = threading.Thread(target=self._run, name="launcher-board", daemon=True)
            self._thread.start()

    def stop(self, final: bool = True) -> None:
        """Stop the thread; with `final`, publish this node's last report (its end, for `launcher status`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
        try:
            if final and self._store is not None:
                # Over a connection already open (the board's, else the rendezvous' own, which this
                # thread may use now that the rounds are over): with the store's host gone, a new one
                # to torch's server (no boot id to tell a gone store by) waits out the connect timeout.
                self.tick(judge=False, connect=False)
        finally:
            if self.board is not None:
                self.board.close()
                self.board = None

    def tick(self, judge: bool = True, connect: bool = True) -> float:
        """One interval: publish, judge, read and post the stragglers (`connect`: open the board's
        connection if it has none yet). Returns the seconds until the next."""
        with self._lock:
            rnd, report, post = self._round, self._report, self._post
        if rnd is None:
            return RETRY_EVERY
        try:
            mine = report()
            if mine is None:  # the node is still starting this round's workers: publish once they run
                return RETRY_EVERY
            mine = self.annotate(mine.stamped(self.node_id, rnd.group_rank, self.wall()))
            board = self._board() if connect else self.board or Board(self._store, self.run_id)
            if board is not None:
                self._forget(board, rnd)
                board.publish(rnd.round, mine)
            if judge and self.judge.threshold:
                self._stragglers(board, rnd, mine, post)
        except Exception:
            log.debug("the job board failed this interval", exc_info=True)
        return REPORT_EVERY

    def _run(self) -> None:
        wait = RETRY_EVERY
        while not self._stop.wait(wait):
            wait = self.tick()

    def _board(self) -> Board | None:
        if self.board is None and self._store is not None:
            self.board = Board(self._store.clone(), self.run_id)
        return self.board

    def _stragglers(self, board: Board | None, rnd: Round, mine: NodeReport, post: Callable[[object], None]) -> None:
        if board is None:  # no store: this node is the job
            flagged = self.judge(running_rates([mine]), self.clock())
        else:
            if rnd.group_rank == 0:
                decided = self.judge(running_rates(board.reports(rnd.round, rnd.group_world_size)), self.clock())
                if decided is not None:
                    board.flag(rnd.round, decided)
            flagged = board.flagged(rnd.round)
        if flagged is not None and frozenset(flagged.ranks) != self._shown:
            self._shown = frozenset(flagged.ranks)
            post(flagged)

    def _forget(self, board: Board, rnd: Round) -> None:
        """Keep this node's reports of the last two rounds; delete older ones (tidying never fails the job)."""
        mine = (rnd.round, rnd.group_rank)
        if mine in self._published:
            return
        old = [p for p in self._published if p[0] <= rnd.round - 2]
        self._published = [p for p in self._published if p[0] > rnd.round - 2] + [mine]
        try:
            board.forget(old)
        except Exception:
            log.debug("deleting old rounds' reports failed", exc_info=True)
