"""Spares: nodes beyond MAX that wait to take a lost member's group rank (docs/spares.md).

A ticket beyond MAX in a round sealed at MAX registers once as spare j (`spares` counter): its alive
key first (held by its agent on stores with LIVENESS or CRASH), then its entry. It waits on the
round's `change` key, counted in the round's `waiting`, so the next round expects it. When a round
ends, a spare lets the members expected back take their tickets first (one store wait on their
entries), so they keep their group ranks and the spare gets the lost one. The node with group rank 0
names each spare that died, once, and drops its entry; `launcher status` lists the live ones.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from ..errors import RendezvousError
from ..net import hostname
from ..spec import Round
from .api import SpareLost, WaitKind, WaitReport
from .keys import Keys
from .records import decode_spare, encode_spare, failure_text, printable, sealed_members
from .store import HELD, Capability, DeletingStore, LivenessStore, Store, any_set, capabilities_of

log = logging.getLogger(__name__)
SPARE_LOOK = 1.0  # seconds between a waiting spare's looks at the job's `closed` mark and at its round's members
YIELD_LOOK = 0.25  # seconds between a yielding spare's looks at which members of the last round are alive
JUDGE_EVERY = 2.0  # seconds between the judge's looks at the spares (2 x spares reads each)
MAX_SPARES = 1 << 16  # a spare counter beyond this is hostile, not ours


@dataclass(frozen=True)
class Spare:
    """A registered spare, as `launcher status` and the judge read it."""

    number: int
    node: str
    host: str
    since: float  # epoch seconds it registered
    alive: bool  # its alive key is held (always True on a store that cannot tell)


def read_spares(store: Store, keys: Keys, count: int) -> list[Spare]:
    """The spares 1..count whose entries are still there, with their alive keys: one request."""
    count = min(count, MAX_SPARES)
    if count <= 0:
        return []
    held = bool(HELD & capabilities_of(store))
    names = [keys.spare(j) for j in range(1, count + 1)]
    raws = store.multi_get(names + ([keys.spare_alive(j) for j in range(1, count + 1)] if held else []))
    found = []
    for j in range(1, count + 1):
        if not raws[j - 1]:
            continue
        try:
            entry = decode_spare(raws[j - 1])
        except RendezvousError:  # garbled or hostile: not a spare of ours
            continue
        alive = not held or bool(raws[count + j - 1])
        found.append(Spare(j, entry["node"], entry["host"], float(entry["since"]), alive))
    return found


def live_spares(store: Store, keys: Keys) -> int:
    """How many spares are waiting, alive, now."""
    return sum(s.alive for s in read_spares(store, keys, store.add(keys.spares, 0)))


def wait_spares_read(store: Store, keys: Keys, at_most: float) -> None:
    """The store host of a job that finished: keep the store up until the live spares read the close
    (each acknowledges it), at most `at_most` s."""
    spares = live_spares(store, keys)
    if spares:
        store.wait([keys.acked(i) for i in range(1, spares + 1)], at_most)


def drop(store: Store, keys: list[str]) -> None:
    """Delete `keys` (a held key is no longer held); on a store that cannot delete, empty them."""
    if Capability.DELETE in capabilities_of(store):
        cast(DeletingStore, store).delete(keys)
    else:
        store.multi_set(keys, [b""] * len(keys))


class Orphaned:
    """A waiting spare's judge of sealed round r (`members` of them): when every member is gone, nobody is
    left to end the round, so `all_gone` (the losses, told by the spare) does. Gone: no member's alive key
    held at two looks in a row (stores that hold them: killed together, or a rerun that found the dead
    run's keys held a moment longer), or, on a store with a heartbeat ring, no member's heartbeat moved
    for the liveness timeout (cut off: a silent connection keeps its key on our TCPStore server)."""

    def __init__(
        self,
        keys: Keys,
        r: int,
        members: int,
        liveness: float,
        clock: Callable[[], float],
        all_gone: Callable[[], None],
    ):
        self.liveness, self.clock, self.all_gone = liveness, clock, all_gone
        self.alive = [keys.alive(r, k) for k in range(1, members + 1)]
        self.beats = [keys.hb(r, g) for g in range(members)]
        self.keys_gone = 0  # looks in a row with no alive key held
        self.counts: list[bytes | None] | None = None  # the heartbeats last read, and since when they stand
        self.since = 0.0

    def look(self, store: Store, began: float) -> None:
        """One look (the wait that preceded it began at `began`); ends the round when every member is gone."""
        caps = capabilities_of(store)
        self.keys_gone = self.keys_gone + 1 if HELD & caps and not any_set(store, self.alive) else 0
        silent = False
        if Capability.LIVENESS not in caps:  # a heartbeat ring
            counts, now = store.multi_get(self.beats), self.clock()
            if counts != self.counts:
                self.counts, self.since = counts, now
            else:  # a slow store delays every heartbeat alike: the time beyond the look's own wait is its
                self.since += max(0.0, now - began - SPARE_LOOK)
                silent = now - self.since > self.liveness
        if self.keys_gone == 2 or silent:  # two looks a second apart: a member between two keys is not gone
            self.all_gone()


class SpareSeat:
    """This node's registration as a spare of the job (number 0: not a spare)."""

    def __init__(self, keys: Keys, node_id: str):
        self.keys = keys
        self.node_id = node_id
        self.number = 0

    def register(self, store: Store) -> None:
        """Take a spare number; hold its alive key, then write its entry (the judge never sees an entry
        without its alive key)."""
        j = store.add(self.keys.spares, 1)
        if HELD & capabilities_of(store):
            cast(LivenessStore, store).hold(self.keys.spare_alive(j))
        store.set(self.keys.spare(j), encode_spare(self.node_id, hostname(), time.time()))
        self.number = j

    def wait(
        self,
        store: Store,
        r: int,
        members: int,
        told: Callable[[WaitReport], None] | None,
        check_closed: Callable[[], None],
        orphaned: Orphaned,
    ) -> bool:
        """Round r is full (`members` of them, MAX): take the seat (once, saying so), be counted among the
        nodes that want round r + 1, and wait, with no deadline, for round r to end; `check_closed` raises
        once the job is closed. `orphaned` tells, at each look, whether every member is gone (nobody is
        left to end the round; it ends it then).
        False when round r was ending already (it re-forms): on to the next round, no wait."""
        if store.get(self.keys.change(r)):
            return False
        line = (
            f"waiting as a spare: round {r} is full ({members} of {members} nodes); "
            "this node takes the place of a node that is lost"
        )
        if not self.number:
            self.register(store)
            log.info(line)
        store.add(self.keys.waiting(r), 1)
        if told is not None:
            told(WaitReport(line, WaitKind.SPARE))
        while True:
            began = orphaned.clock()
            if store.wait([self.keys.change(r)], SPARE_LOOK):
                break
            check_closed()
            orphaned.look(store, began)
        check_closed()
        if told is not None:  # the standby ends: from here this node's time is the job's (its goodput)
            told(WaitReport(f"round {r} ended: this spare joins the next round", WaitKind.NODES))
        return True

    def leave(self, store: Store, why: str) -> None:
        """The agent ends while it waits as a spare (`why`: a signal, said in one line; empty: quietly)."""
        if why:
            log.info(f"left as a spare ({why})")
        self.unregister(store)

    def joined(self, store: Store, r: int, lost: dict[int, str]) -> None:
        """This spare took a seat in round r: say the cause it steps in for (a worker's failure, else the
        members lost from round r - 1, `lost`: group rank -> why; else why the round before ended)."""
        failure = failure_text(store.get(self.keys.cause(r - 1))) if r > 0 else None
        why = printable(store.get(self.keys.change(r - 1)) or b"") if r > 0 else ""
        said = f"a worker failed on another node: {failure}" if failure else f"membership changed ({why})"
        if lost and not failure:  # the round may have ended for another reason first (an in-place round after)
            said = f"a node was lost: {'; '.join(printable(t) for _, t in sorted(lost.items()))}"
        log.info(f"{said}: this spare takes a seat in round {r}")
        self.unregister(store)

    def unregister(self, store: Store) -> None:
        """No longer a spare (it joined a round, or it leaves): its entry first, then its alive key."""
        j, self.number = self.number, 0
        if j:
            drop(store, [self.keys.spare(j)])
            drop(store, [self.keys.spare_alive(j)])


def yield_to_members(
    store: Store, keys: Keys, r: int, max_nodes: int, timeout: float, clock: Callable[[], float]
) -> None:
    """A spare lets the members expected back from round r - 1 take round r's first tickets, so they keep
    their group ranks: it waits (at most `timeout`) until tickets 1..m have their entries, m = round r - 1's
    members less those lost or dead. On a store that holds alive keys it stops waiting sooner, once as
    many tickets were taken as round r - 1 has members alive (one that died before it was judged lost
    never comes: its alive key is gone)."""
    sealed = sealed_members(store.get(keys.sealed(r - 1))) if r > 0 else None
    if not sealed:
        return
    members = min(sealed - store.add(keys.left(r - 1), 0) - store.add(keys.dead(r - 1), 0), max_nodes)
    entries = [keys.node(r, i) for i in range(1, members + 1)]
    held = HELD & capabilities_of(store)
    deadline = clock() + timeout
    while members > 0 and clock() < deadline:
        if store.wait(entries, max(0.001, min(YIELD_LOOK, deadline - clock()))):
            return
        if held:
            alive = store.multi_get([keys.alive(r - 1, k) for k in range(1, sealed + 1)])
            if store.add(keys.joined(r), 0) >= sum(bool(v) for v in alive):
                return


class SpareJudge:
    """Run by the node with group rank 0 beside its heartbeat: every JUDGE_EVERY s, name each spare that
    died (its alive key gone) once, drop its entry and count it out of the next round (`dead`)."""

    def __init__(self, keys: Keys, clock: Callable[[], float]):
        self.keys = keys
        self.clock = clock
        self._at = float("-inf")

    def tick(self, store: Store, rnd: Round, post: Callable[[object], None]) -> None:
        if rnd.group_rank != 0 or self.clock() - self._at < JUDGE_EVERY or not HELD & capabilities_of(store):
            return
        r = rnd.round
        self._at = self.clock()
        try:
            for spare in read_spares(store, self.keys, store.add(self.keys.spares, 0)):
                if not spare.alive:
                    log.warning(f"spare {spare.node} died; dropped")
                    drop(store, [self.keys.spare(spare.number)])
                    store.add(self.keys.dead(r), 1)
                    post(SpareLost(spare.node))
        except Exception:  # judging spares must never disturb the job
            log.debug("judging the spares failed", exc_info=True)
