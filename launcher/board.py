"""The job board: each node's snapshot (for `launcher status`) and the job's straggler list, kept
in the rendezvous store beside the protocol's keys while a round runs.

Each node publishes its snapshot under `r<r>/snap<g>` at most every SNAPSHOT_EVERY s (one key per
node: O(N) store writes per interval); the node with group rank 0 judges stragglers over every
snapshot (O(N) reads, one write) and every node reads the list (one get). Never fails the job.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from .rendezvous.api import Stragglers
from .rendezvous.keys import Keys
from .rendezvous.records import MAX_VALUE, decode_stragglers, encode_stragglers, read_snapshot
from .rendezvous.store import Store
from .spec import Round
from .stragglers import Judge, running_rates

log = logging.getLogger(__name__)
SNAPSHOT_EVERY = 2.0  # seconds between a node's snapshots


class Board:
    """This node's side of the board: publish its snapshot; judge (group rank 0) and read the stragglers."""

    def __init__(self, keys: Keys, node_id: str, clock: Callable[[], float], judge: Judge | None):
        self.keys = keys
        self.node_id = node_id
        self.clock = clock
        self.judge = judge  # run on the node with group rank 0, over every node's snapshot
        self._report: Callable[[], dict | None] | None = None  # this node's snapshot, published while a round runs
        self._flagged: frozenset[int] = frozenset()
        self._reported_at = float("-inf")

    def start(self, report: Callable[[], dict | None] | None) -> None:
        """A new round: publish `report()` from now on (None: nothing to publish)."""
        self._report, self._reported_at, self._flagged = report, float("-inf"), frozenset()

    def publish(self, st: Store, rnd: Round, post: Callable[[object], None] | None = None, force: bool = False) -> None:
        """This node's snapshot, at most every SNAPSHOT_EVERY s (`force`: now); then, given `post`, the
        stragglers, posted when the flagged ranks change."""
        if self._report is None or (not force and self.clock() - self._reported_at < SNAPSHOT_EVERY):
            return
        try:
            mine = self._report()
            if mine is None:  # the node is still starting this round's workers: publish once they run
                return
            self._reported_at = self.clock()
            snap = {**mine, "node": self.node_id, "group_rank": rnd.group_rank, "time": time.time()}
            raw = json.dumps(snap).encode()
            if len(raw) > MAX_VALUE:  # a node of very many workers: the node's line without them
                raw = json.dumps({**snap, "workers": []}).encode()
            st.set(self.keys.snap(rnd.round, rnd.group_rank), raw)
            if post is not None and self.judge is not None and self.judge.threshold:
                self._stragglers(st, rnd, post)
        except Exception:
            log.debug("publishing this node's snapshot failed", exc_info=True)

    def _stragglers(self, st: Store, rnd: Round, post: Callable[[object], None]) -> None:
        key = self.keys.stragglers(rnd.round)
        if rnd.group_rank == 0 and self.judge is not None:
            snaps = (read_snapshot(st.get(self.keys.snap(rnd.round, g))) for g in range(rnd.group_world_size))
            flagged = self.judge(running_rates(snaps), self.clock())
            if flagged is not None:
                st.set(key, encode_stragglers(flagged.median, flagged.ranks))
        read = decode_stragglers(st.get(key))
        if read is None:
            return
        median, ranks = read
        if frozenset(ranks) != self._flagged:
            self._flagged = frozenset(ranks)
            post(Stragglers(median, ranks))
