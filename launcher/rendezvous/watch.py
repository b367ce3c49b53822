"""The watcher: one loop, on its own thread and store connection, that waits for a sealed round to end.

Every node blocks on its round's `change` key (a store wait or an etcd watch: no polling of state)
and judges only its right-hand neighbour, so a dead node is noticed within the liveness timeout at
O(N) cost per interval. How it judges depends on what the store can tell (`store.Capability`):
- nothing: a heartbeat ring; each node bumps its own counter and reads its neighbour's;
- CRASH (our TCPStore server): the ring stays, and the wait also ends the moment the neighbour's
  `alive` key vanishes (its agent's connections closed);
- LIVENESS (etcd: a lease per agent): no ring; the wait ends when the neighbour's `alive` key vanishes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from ..errors import RendezvousConnectionError, RendezvousError
from ..spec import Round
from .api import MembershipChanged
from .keys import Keys
from .store import HELD, Capability, Change, DeletingStore, LivenessStore, Store, capabilities_of

log = logging.getLogger(__name__)


@dataclass
class RoundWatch:
    """This node's watch over round `rnd`; `run` posts what ended it (once) and returns."""

    store: Store  # the node's store: the watch clones its own connection from it
    keys: Keys
    rnd: Round
    peer: int  # the right-hand neighbour's ticket (0: unknown), whose `alive` key a store may hold
    interval: float  # keep_alive_interval: between heartbeats, and the longest single wait
    liveness_timeout: float  # a neighbour whose heartbeat stands still this long is dead
    clock: Callable[[], float]
    ended: Callable[[Store, int], MembershipChanged]  # round r ended: what to post
    died: Callable[[Store, int, int, int, str], None]  # (store, r, n, neighbour's group rank, how) it died
    tidy: Callable[[Store, int], None] = lambda st, r: None  # before watching: delete old rounds' keys
    tick: Callable[[Store], None] = lambda st: None  # once per turn, beside the heartbeat (the spares' judge)

    def run(self, stop: threading.Event, post: Callable[[object], None]) -> None:
        """Watch until the round ends, `stop` is set, or the store is lost (posted as a membership change)."""
        try:
            st = self.store.clone()
        except Exception as e:
            log.debug("the watcher could not connect to the store", exc_info=True)
            post(MembershipChanged(f"lost the rendezvous store: {e}"))
            return
        try:
            self.tidy(st, self.rnd.round)
            self._loop(st, stop, post)
        except RendezvousError as e:
            log.debug("the watcher stopped on the store's answer", exc_info=True)
            if not stop.is_set():
                lost = isinstance(e, RendezvousConnectionError)
                post(MembershipChanged(f"lost the rendezvous store: {e}" if lost else str(e)))
        except Exception as e:
            log.debug("the watcher lost the store", exc_info=True)
            if not stop.is_set():
                post(MembershipChanged(f"lost the rendezvous store: {e}"))
        finally:
            st.close()

    def _loop(self, st: Store, stop: threading.Event, post: Callable[[object], None]) -> None:
        k, r, g, n = self.keys, self.rnd.round, self.rnd.group_rank, self.rnd.group_world_size
        right = (g + 1) % n
        caps = capabilities_of(st)
        beats = Capability.LIVENESS not in caps  # a store that tells liveness itself needs no ring
        alive = k.alive(r, self.peer) if HELD & caps and right != g and self.peer else None
        gone = "died (its store session ended)" if beats else "lost its lease"
        change = k.change(r)
        seen, seen_at = -1, self.clock()
        while not stop.is_set():
            began = self.clock()
            if beats:
                st.add(k.hb(r, g), 1)
            self.tick(st)
            if alive is None and beats:
                what = Change.CHANGED if st.wait([change], self.interval) else None
            else:  # the same wait, cut short when the neighbour's alive key vanishes
                what = cast(LivenessStore, st).wait_change(change, alive, self.interval)
            if what is Change.CHANGED:
                if not stop.is_set():
                    post(self.ended(st, r))
                return
            if what is Change.GONE:
                alive = None  # judged once; a finished neighbour simply went home
                if not st.get(k.done(r, right)):
                    self.died(st, r, n, right, gone)
                continue
            if not beats or right == g or st.get(k.done(r, right)):
                continue
            count = st.add(k.hb(r, right), 0)
            now = self.clock()
            if count != seen:
                seen, seen_at = count, now
                continue
            # A slow store (a flood of clients, a stalled host) delays every node's heartbeat alike:
            # the time this turn took beyond its own wait is the store's, not the neighbour's silence.
            seen_at += max(0.0, now - began - self.interval)
            if now - seen_at > self.liveness_timeout:
                self.died(st, r, n, right, "stopped heartbeating")


def forget_old_rounds(st: Store, keys: Keys, mine: list[tuple[int, int, int]], r: int) -> list[tuple[int, int, int]]:
    """Before watching round r: delete this node's own per-node keys of its rounds before the last one
    (`mine`: (round, ticket, group rank)), where the store can, so a long job keeps a few counters per
    round, not O(nodes) keys; returns the rounds still to tidy later. Their `change` and `sealed` markers
    stay: a node that wakes up in an old round still learns that it ended."""
    old = [m for m in mine if m[0] <= r - 2]
    caps = capabilities_of(st)
    if not old or Capability.DELETE not in caps:
        return mine
    held = (keys.alive,) if Capability.CRASH in caps else ()  # held for the agent's life otherwise
    try:
        cast(DeletingStore, st).delete(
            [key(o, k) for o, k, g in old for key in (keys.node, keys.plan, *held)] + [keys.hb(o, g) for o, k, g in old]
        )
    except Exception:  # tidying must never disturb the job
        log.debug("deleting old rounds' keys failed", exc_info=True)
    return [m for m in mine if m[0] > r - 2]
