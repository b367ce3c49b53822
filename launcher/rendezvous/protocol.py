"""The elastic rendezvous protocol, the same on every store.

A job is a sequence of rounds. In round r every node takes a ticket (an atomic counter), writes
one small descriptor, and the round is *sealed* once MAX nodes joined, or once the nodes expected
from the last round are back, or once the last call after MIN nodes ran out. The sealer alone
reads the descriptors and writes one plan key per node (ranks, world, bootstrap address), so a
round costs O(N) store operations in total; nobody rewrites a shared blob. A node joins in five
calls: one read (round, closed, token), its ticket, its alive key, its descriptor, and a wait that
returns its plan (a ticket below MIN is in every seal, so it waits for its plan directly).

A sealed round ends when any node writes its `change` key: a worker failed (charged once to the
job-wide restart budget), a node stopped heartbeating, a late node wants in, or a node left. Every
node blocks on that key (a store wait or an etcd watch: no polling of state). Liveness is a ring:
each node bumps its own heartbeat counter and judges only its right-hand neighbour's, so a dead
node is noticed within the liveness timeout at O(N) cost per interval. A store that can tell
liveness itself (etcd: a lease per agent) offers `hold` and `wait_change` instead: each node holds
an `alive` key from the moment it takes a ticket, and watches only its right-hand neighbour's.
A store that can tell a crash but not a freeze (our TCPStore server: a key held by the agent's
connections, deleted once they all closed and a 0.1 s grace for a reconnect passed) declares
CRASH: the heartbeat ring stays, and each node's wait on `change` also ends the moment its
neighbour's `alive` key vanishes.

Keys, under `<prefix>/<run_id>/`:
    round, closed, restarts                      job-wide
    verdict  acks  acked<k>                      the job's root cause, written before `closed`; who read it
    r<r>/joined  r<r>/node<k>  r<r>/sealed        forming a round (k = ticket, 1-based)
    r<r>/plan<k>                                  what the sealer decided for ticket k
    r<r>/change  r<r>/failed  r<r>/left  r<r>/waiting  r<r>/hb<g>  r<r>/done<g>  r<r>/finished
    r<r>/alive<k>                                 held by ticket k's agent (stores with LIVENESS or CRASH)
    r<r>/cause                                    the root cause of the failure that ended round r (a verdict)
    r<r>/snap<g>                                  group rank g's snapshot for `launcher status`, every 2 s
    r<r>/stragglers                               the ranks group rank 0's judge flagged, with the median rate
    r<r>/lost<g>  r<r>/dead                       why group rank g was lost; tickets and spares found dead
    spares  spare<j>  sparealive<j>               spare j's number, entry (node, host, since) and held alive key

Spares (docs/spares.md): a ticket beyond MAX in a round sealed at MAX registers once as spare j and waits
on the round's `change`, counted in its `waiting`. When the round ends it lets the members expected back
take their tickets first, then takes one: a member lost (dead, or gone) leaves its group rank free, and
the spare gets it. A lost member that leaves fewer than MIN charges one restart (with any worker failure
of that round: the `failed` counter charges once); the next round then waits `replace_timeout` for a
replacement, and closes the job with the reason past it.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, cast

from ..errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousTimeoutError,
    RestartBudgetExhausted,
)
from ..net import hostname, interface_of, outward_address
from ..spec import Round, Verdict
from ..stragglers import Judge, running_rates
from .api import Cause, JobParams, MembershipChanged, SpareLost, Stragglers, WaitKind, WaitReport
from .settings import RendezvousSettings

log = logging.getLogger(__name__)
MAX_VALUE = 1 << 16  # a descriptor or plan larger than this is hostile, not ours
MAX_VERDICT = 4096  # a verdict is a few short fields; anything larger is not ours
WAIT_REPORT_EVERY = 5.0  # seconds between the lines that say what a forming round waits for
MISSING_NAMED = 8  # at most this many missing nodes are named in such a line
HOST_LEAVING_WAIT = 10.0  # a store host that leaves a running job (a signal) waits at most this for the readers
SNAPSHOT_EVERY = 2.0  # seconds between a node's snapshots (one key per node: O(N) store writes per interval)
LOOK_EVERY = 1.0  # seconds between a would-be sealer's looks at a forming round's count
SPARE_LOOK = 1.0  # seconds between a spare's looks at the job's `closed` mark while it waits
FINISHED = "it finished"  # how the close of a job that succeeded begins: a spare ends with exit 0


class Capability(enum.Enum):
    """An optional part of the `Store` interface; a store lists those it has in `capabilities`."""

    DELETE = "delete"  # `DeletingStore.delete`: old rounds' per-node keys are deleted as the job goes on
    LIVENESS = "liveness"  # `LivenessStore.hold`/`wait_change`: the store knows who is alive (no heartbeat ring)
    CRASH = "crash"  # the same methods tell a crashed agent at once; heartbeats still judge a frozen one


class Change(enum.Enum):
    """What `LivenessStore.wait_change` saw before its timeout."""

    CHANGED = "change"  # the round's `change` key exists
    GONE = "gone"  # the watched `alive` key vanished: its agent died (or finished)


class Store(Protocol):
    """The handful of operations the protocol needs; each backend maps them onto its store.

    The optional parts are declared, not guessed: a store names them in `capabilities`, and
    offers then the methods of `DeletingStore` (DELETE) and `LivenessStore` (LIVENESS). A store
    without a `capabilities` attribute has the required operations only (see `capabilities_of`).
    A wrapper that forwards attributes to a store (a counter in the benchmarks) forwards the
    declaration with them.
    """

    capabilities: frozenset[Capability]

    def add(self, key: str, amount: int) -> int: ...
    def get(self, key: str) -> bytes | None: ...  # None when absent; never blocks
    def set(self, key: str, value: bytes) -> None: ...
    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes: ...  # returns the value now
    def wait(self, keys: Sequence[str], timeout: float) -> bool: ...  # True once every key exists
    def wait_get(
        self, key: str, timeout: float
    ) -> bytes | None: ...  # the value once `key` exists; None at the timeout
    def multi_get(self, keys: Sequence[str]) -> list[bytes | None]: ...  # None or b"" when absent; never blocks
    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None: ...
    def clone(self) -> Store: ...  # a second connection, for the watcher thread
    def close(self) -> None: ...


class DeletingStore(Store, Protocol):
    """A store with `Capability.DELETE`."""

    def delete(self, keys: Sequence[str]) -> None: ...


class LivenessStore(Store, Protocol):
    """A store with `Capability.LIVENESS` (it knows which agents are alive: etcd, a lease each) or
    `Capability.CRASH` (it knows which agents' processes are gone: our TCPStore server's held keys)."""

    def hold(self, key: str) -> None:
        """`key` exists for as long as this agent lives."""

    def wait_change(self, change: str, alive: str | None, timeout: float) -> Change | None:
        """CHANGED once `change` exists, GONE once `alive` is absent (never when it is None), None at
        the timeout. LIVENESS: store trouble counts as a timeout; CRASH: it raises, as `wait` does."""


HELD = frozenset({Capability.LIVENESS, Capability.CRASH})  # the stores that `hold` an alive key per member


def capabilities_of(store: Store) -> frozenset[Capability]:
    """The optional parts `store` declares; none when it declares nothing."""
    return frozenset(getattr(store, "capabilities", ()))


@dataclass(frozen=True)
class Node:
    """What this node tells the others when it joins a round."""

    node_id: str  # host:pid, unique per agent
    addr: str  # where its workers can be reached (the bootstrap store, if it gets rank 0)
    nproc: int
    min_nodes: int
    max_nodes: int
    max_restarts: int
    ifname: str | None = None  # the interface that carries `addr`
    token: str | None = field(default=None, repr=False)  # the job's join token, if it has one

    @classmethod
    def of_this_agent(cls, job: JobParams, store: tuple[str, int]) -> Node:
        """This agent as it joins: reached at --local_addr, else at its address on the route to `store`."""
        addr = job.local_addr or outward_address(*store)
        return cls(
            node_id=f"{hostname()}:{os.getpid()}",
            addr=addr,
            ifname=interface_of(addr),
            nproc=job.nproc_per_node,
            min_nodes=job.min_nodes,
            max_nodes=job.max_nodes,
            max_restarts=job.max_restarts,
            token=job.join_token,
        )


class ElasticRendezvous:
    """Rounds, last call, seal, liveness and the job-wide restart budget over any `Store`."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        node: Node,
        settings: RendezvousSettings,
        *,
        port_picker: Callable[[], int],
        is_host: bool = False,
        clock: Callable[[], float] = time.monotonic,
        judge: Judge | None = None,
    ):
        self.store = store
        self.node = node
        self.settings = settings
        self.pick_port = port_picker
        self.is_host = is_host
        self.clock = clock
        self.prefix = f"{run_id}/"
        self.run_id = run_id
        self.current: Round | None = None
        self.ticket = 0
        self.group_rank = -1  # kept across rounds where possible
        self.peer = 0  # ticket of the right-hand neighbour in the current round (stores with liveness)
        self._mine: list[tuple[int, int, int]] = []  # (round, ticket, group rank) of recent rounds, to tidy
        self._stop_watch = threading.Event()
        self._watcher: threading.Thread | None = None
        self._acked = False  # this node told the store host it read the job's verdict
        self._ack_lock = threading.Lock()
        self._seen_closed: RendezvousClosedError | None = None  # read once (by the watcher, or joining), kept
        self._on_wait: Callable[[WaitReport], None] | None = None
        self._report: Callable[[], dict | None] | None = None  # this node's snapshot, published while a round runs
        self.judge = judge  # stragglers: run on the node with group rank 0, over every node's snapshot
        self._flagged: frozenset[int] = frozenset()
        self._reported_at = float("-inf")
        self.spare_no = 0  # this node's number as a registered spare (0: not a spare)
        self._forming: tuple[int, int] | None = (
            None  # (round, ticket) while this node holds a ticket in a forming round
        )
        self._last: Round | None = None  # the round this node left last (a node gone while re-forming is lost from it)
        self._refill = False  # the round forming lost members and is below MIN: it waits replace_timeout

    # ------------------------------------------------------------------ the handler interface

    def next_round(
        self, cause: Cause, verdict: Verdict | None = None, waiting: Callable[[WaitReport], None] | None = None
    ) -> Round:
        """Leave the current round (reporting a failure if that is the cause) and join the next one.

        `verdict`: this node's root cause of a FAILURE, published as the job's if it closes the job.
        `waiting`: told each WAIT_REPORT_EVERY s what the forming round waits for (the live view's row)."""
        self._stop_watch.set()
        self._on_wait = waiting
        if self._seen_closed is not None:  # the watcher saw the close: the store may be gone already
            raise self._seen_closed
        try:
            if self.current is None:
                r = self._look(first=True)
            else:
                r = self.current.round
                if cause is Cause.FAILURE:
                    self._report_failure(r, verdict)
                self._set_change(r, f"{self.node.node_id}: {cause.value}")
                self._advance(r)
                self._last, self.current = self.current, None
                r = self._look()
            return self._join(r)
        except RendezvousError:  # RestartBudgetExhausted is one too
            raise
        except Exception as e:  # a store that went away mid-protocol
            raise RendezvousConnectionError(f"rendezvous store failed: {e}") from e

    def watch(
        self, rnd: Round, post: Callable[[object], None], report: Callable[[], dict | None] | None = None
    ) -> None:
        """Heartbeat, judge the neighbour, publish `report()` every SNAPSHOT_EVERY s, and post
        MembershipChanged when the round ends."""
        self._report, self._reported_at, self._flagged = report, float("-inf"), frozenset()
        self._stop_watch = stop = threading.Event()
        self._watcher = threading.Thread(
            target=self._watch, args=(rnd, post, stop, self.peer), name="launcher-rdzv-watch", daemon=True
        )
        self._watcher.start()

    def shutdown(self, succeeded: bool, why: str = "") -> None:
        """Finished: mark done (the store host waits for the others). Failed or signalled: leave the round."""
        self._stop_watch.set()
        rnd = self.current
        if rnd is None:
            return self._leave_waiting(succeeded, why)
        try:
            self._publish(self.store, rnd, force=True)  # the node's last word, for `launcher status`
            r, g = rnd.round, rnd.group_rank
            if succeeded:
                self.store.set(self._k(f"r{r}/done{g}"), b"1")
                if (
                    self.store.add(self._k(f"r{r}/finished"), 1) >= rnd.group_world_size
                ):  # the last one: the job is done; a late node stops, and the spares wake and end with exit 0
                    self._close(f"{FINISHED} (round {r} ended on all {rnd.group_world_size} nodes)")
                    self._set_change(r, "the job finished")
                if self.is_host:  # the others still need the store: wait for them (exit barrier), then the spares
                    self._wait_finished(rnd)
                    self._wait_spares_read()
            elif not self.store.get(self._k("closed")):
                left = f"{self.node.node_id} left" + (f": {why}" if why else "")
                if self.is_host:  # the store goes with this node: the job ends, and the others learn why
                    self._set_change(r, self._close(f"the node hosting the store ({left})"))
                    self._ack()
                    self._wait_acks(rnd, HOST_LEAVING_WAIT)
                else:
                    self._lost(self.store, r, rnd.group_world_size, g, left)
            elif self.is_host:  # the others still read the verdict from this store: wait for them
                self._wait_acks(rnd)
        except Exception:  # leaving must never fail the exit
            log.debug("leaving the rendezvous failed", exc_info=True)
        finally:
            if self._watcher:
                self._watcher.join(self.settings.keep_alive_interval + 1.0)

    def _leave_waiting(self, succeeded: bool, why: str) -> None:
        """Leave while in no round: a ticket of a forming round gives its alive key up (the sealer leaves it
        out; sealed already, its neighbour sees it gone), counted as lost from the round it was in before;
        a spare drops its registration. On a connection of its own: the joining thread may be in a wait."""
        if self._forming is None and not self.spare_no:
            return
        try:
            st = self.store.clone()
        except Exception:  # the store is gone: nothing to tell it
            log.debug("leaving the rendezvous failed", exc_info=True)
            return
        gone = f"{self.node.node_id} left" + (f": {why}" if why else "")
        try:
            if self._forming is not None:
                r, k = self._forming
                if not succeeded:
                    log.info(f"left round {r} while it formed ({why or 'gave up'})")
                self._drop(st, [self._k(f"r{r}/alive{k}")])
                last = self._last
                if last is not None and last.round == r - 1 and not succeeded:
                    self._lost(st, last.round, last.group_world_size, last.group_rank, gone)
            if self.spare_no:
                if not succeeded and why:
                    log.info(f"left as a spare ({why})")
                self._unregister_spare(st)
        except Exception:  # leaving must never fail the exit
            log.debug("leaving the rendezvous failed", exc_info=True)
        finally:
            st.close()

    # ------------------------------------------------------------------ joining

    def _join(self, r: int) -> Round:
        """Take a ticket in round r (the job not closed: `_look` just read it) and wait for its plan;
        a node that came too late asks for a new round, or waits as a spare when the round is full."""
        s, st = self.settings, self.store
        while True:
            self._refill = self._refilling(r)
            deadline = self.clock() + (s.replace_timeout if self._refill else s.join_timeout)
            if self.spare_no:
                self._yield_to_members(r, deadline)
            k = st.add(self._k(f"r{r}/joined"), 1)
            if k < 1:  # the protocol only ever adds to it
                raise RendezvousError("rendezvous store holds a malformed ticket counter under this job's prefix")
            # Every seal counts MIN tickets or more, so a ticket within MIN is a member of any seal: no
            # need to read `sealed`. A later one may have come after the seal.
            sealed = None if k <= self.node.min_nodes else self._sealed(r)
            # A ticket within the sealed count is a member even when the seal came first: the
            # sealer counted it and waits for its entry.
            if k <= self.node.max_nodes and (sealed is None or k <= sealed):
                self.ticket, self._forming = k, (r, k)
                if HELD & capabilities_of(st):  # before the descriptor: a sealed member without one has died
                    cast(LivenessStore, st).hold(self._k(f"r{r}/alive{k}"))
                port = self.pick_port()
                desc = {
                    "id": self.node.node_id,
                    "addr": self.node.addr,
                    "port": port,
                    "nproc": self.node.nproc,
                    "prev": self.group_rank,
                }
                st.set(self._k(f"r{r}/node{k}"), json.dumps(desc).encode())
                if k < self.node.min_nodes:  # it never seals: it waits for its plan, nothing else
                    rnd = self._wait_plan(r, k, deadline)
                else:
                    self._wait_sealed(r, k, deadline)
                    sealed = self._sealed(r)
                    rnd = self._take_plan(r, k, deadline) if sealed is not None and k <= sealed else None
                if rnd is not None:
                    self._forming = None
                    if self.spare_no:
                        self._unregister_spare(st)
                    return rnd  # else the sealer left this ticket out: as if it came too late
                self._forming = None
            if sealed is None:
                sealed = self._wait_for(r, deadline)
            # The round formed without this node: ask for a new one, or wait as a spare when full.
            if sealed < self.node.max_nodes:
                st.add(self._k(f"r{r}/waiting"), 1)
                self._set_change(r, f"{self.node.node_id} wants to join")
            else:
                self._wait_as_spare(r, sealed)
            self._advance(r)
            r = self._look()

    # ------------------------------------------------------------------ spares

    def _wait_as_spare(self, r: int, sealed: int) -> None:
        """Round r is full: register as a spare (once), be counted among the nodes waiting for the next
        round, and wait, with no deadline, for round r to end; raise once the job is closed."""
        st = self.store
        if st.get(self._k(f"r{r}/change")):  # it ends already (it re-forms): on to the next round
            return
        self.group_rank = -1  # a spare takes the group rank that is free, never an old one of its own
        first = not self.spare_no
        if first:
            self._register_spare(st)
        st.add(self._k(f"r{r}/waiting"), 1)
        line = (
            f"waiting as a spare: round {r} is full ({sealed} of {self.node.max_nodes} nodes); "
            "this node takes the place of a node that is lost"
        )
        if first:
            log.info(line)
        if self._on_wait is not None:
            self._on_wait(WaitReport(line, WaitKind.SPARE))
        while not st.wait([self._k(f"r{r}/change")], SPARE_LOOK):
            self._check_closed()
        self._check_closed()

    def _register_spare(self, st: Store) -> None:
        """Spare number j: its alive key first (held while its agent lives), then its entry."""
        j = st.add(self._k("spares"), 1)
        if HELD & capabilities_of(st):
            cast(LivenessStore, st).hold(self._k(f"sparealive{j}"))
        entry = {"node": self.node.node_id, "host": hostname(), "since": time.time()}
        st.set(self._k(f"spare{j}"), json.dumps(entry).encode())
        self.spare_no = j

    def _unregister_spare(self, st: Store) -> None:
        """No longer a spare (it joined a round, or it leaves): its entry first, then its alive key."""
        j, self.spare_no = self.spare_no, 0
        self._drop(st, [self._k(f"spare{j}")])
        self._drop(st, [self._k(f"sparealive{j}")])

    def _yield_to_members(self, r: int, deadline: float) -> None:
        """A spare lets the members expected back from round r - 1 take round r's first tickets (one store
        wait on their entries, at most last_call_timeout), so they keep their group ranks."""
        prev = self._sealed(r - 1) if r > 0 else None
        if not prev:
            return
        gone = self.store.add(self._k(f"r{r - 1}/left"), 0) + self.store.add(self._k(f"r{r - 1}/dead"), 0)
        members = min(prev - gone, self.node.max_nodes)
        if members > 0:
            keys = [self._k(f"r{r}/node{i}") for i in range(1, members + 1)]
            self.store.wait(keys, self._slice(deadline, self.settings.last_call_timeout))

    def _judge_spares(self, st: Store, r: int, post: Callable[[object], None]) -> None:
        """The node with group rank 0: name each spare that died (its alive key gone) once, drop its
        entry, and count it out of the nodes expected in the next round."""
        if not HELD & capabilities_of(st):
            return
        count = st.add(self._k("spares"), 0)
        for spare in read_spares(st, self._k, count):
            if not spare.alive:
                log.warning(f"spare {spare.node} died; dropped")
                self._drop(st, [self._k(f"spare{spare.number}")])
                st.add(self._k(f"r{r}/dead"), 1)
                post(SpareLost(spare.node))

    def _drop(self, st: Store, keys: list[str]) -> None:
        """Delete `keys` (a held one is no longer held); where the store cannot delete, empty them."""
        if Capability.DELETE in capabilities_of(st):
            cast(DeletingStore, st).delete(keys)
        else:
            st.multi_set(keys, [b""] * len(keys))

    def _live_spares(self, st: Store) -> int:
        return sum(s.alive for s in read_spares(st, self._k, st.add(self._k("spares"), 0)))

    def _wait_spares_read(self) -> None:
        """The store host of a job that finished: keep the store up until the live spares read the close
        (each acknowledges it), at most HOST_LEAVING_WAIT."""
        spares = self._live_spares(self.store)
        if spares:
            self.store.wait([self._k(f"acked{i}") for i in range(1, spares + 1)], HOST_LEAVING_WAIT)

    # ------------------------------------------------------------------ losing a member

    def _refilling(self, r: int) -> bool:
        """Round r - 1 lost members (dead or gone) and left fewer than MIN: round r waits for replacements."""
        prev = self._sealed(r - 1) if r > 0 else None
        if not prev:
            return False
        left = self.store.add(self._k(f"r{r - 1}/left"), 0)
        return left > 0 and prev - self.store.add(self._k(f"r{r - 1}/dead"), 0) - left < self.node.min_nodes

    def _lost(self, st: Store, r: int, n: int, g: int, why: str) -> None:
        """Group rank g of round r (n members) is lost: it died or left. One rule for both: below MIN, one
        restart is charged (once per round, with any worker failure: the `failed` counter), and the job
        closes when none is left; then the round ends, with the reason."""
        st.set(self._k(f"r{r}/lost{g}"), why[:300].encode())
        left = st.add(self._k(f"r{r}/left"), 1)
        if n - left < self.node.min_nodes and st.add(self._k(f"r{r}/failed"), 1) == 1:
            if st.add(self._k("restarts"), 1) > self.node.max_restarts:
                self._close(
                    f"{why}; {n - left} node(s) left, fewer than {self.node.min_nodes}, and no restart left "
                    f"to replace it (--max_restarts {self.node.max_restarts})",
                    st,
                )
        self._set_change(r, why, st)

    def _lost_reasons(self, r: int) -> dict[int, str]:
        """Group rank -> why it was lost in round r (O(N) reads: the first ticket and the closer only)."""
        n = self._sealed(r) or 0
        raws = self.store.multi_get([self._k(f"r{r}/lost{g}") for g in range(n)]) if n else []
        return {g: raw.decode(errors="replace") for g, raw in enumerate(raws) if raw}

    def _wait_sealed(self, r: int, k: int, deadline: float) -> None:
        """Block until round r is sealed; seal it ourselves when the rules say it is time.

        A ticket that completes the round (MAX, or the nodes expected back from the last round)
        seals at once. Otherwise each node from MIN on keeps its own last call and looks again
        every second (the expected count may fall as nodes leave): a forming round of N nodes
        costs O(N) store operations per second, whatever its MIN and MAX."""
        s, st, n = self.settings, self.store, self.node
        last_call = self.clock() + s.last_call_timeout
        report_at = self.clock() + WAIT_REPORT_EVERY
        count = k
        while True:
            expected = self._expected(r)
            if count >= n.max_nodes or (expected and count >= max(expected, n.min_nodes)) or self.clock() >= last_call:
                self._seal(r, count)
            if st.wait(
                [self._k(f"r{r}/sealed")], self._slice(deadline, max(0.001, min(LOOK_EVERY, last_call - self.clock())))
            ):
                return
            self._check_closed()
            if self.clock() >= deadline:
                raise self._no_round(r)
            report_at = self._tell_waiting(r, k, deadline, last_call, report_at)
            count = min(st.add(self._k(f"r{r}/joined"), 0), n.max_nodes)

    def _wait_plan(self, r: int, k: int, deadline: float) -> Round | None:
        """A ticket below MIN: wait for its plan directly. Every WAIT_REPORT_EVERY s it says what
        the round waits for and reads `closed` and `sealed` in one request: the job may have closed,
        the sealer may have died before writing the plans (given two read_timeouts), or a node of
        another MIN may have sealed below this ticket. A forming round of N nodes thus costs O(N)
        store operations per interval, and none between."""
        key = self._k(f"r{r}/plan{k}")
        report_at, sealed_at = self.clock() + WAIT_REPORT_EVERY, None
        while (raw := self.store.wait_get(key, self._slice(deadline, max(0.001, report_at - self.clock())))) is None:
            closed, sealed = self.store.multi_get([self._k("closed"), self._k(f"r{r}/sealed")])
            if closed:
                self._check_closed()
            count = sealed_members(sealed)
            if count is not None and k > count:
                return None  # sealed below this ticket
            if count is not None:
                sealed_at = sealed_at if sealed_at is not None else self.clock()
                if self.clock() - sealed_at > 2 * self.settings.read_timeout:
                    raise self._no_plan(r)
            if self.clock() >= deadline:
                raise self._no_round(r)
            report_at = self._tell_waiting(r, k, deadline, None, report_at)
        return self._plan(r, k, raw)

    def _tell_waiting(self, r: int, k: int, deadline: float, last_call: float | None, report_at: float) -> float:
        """Every WAIT_REPORT_EVERY s, log (and show) what the forming round waits for; the next time to."""
        if self.clock() < report_at:
            return report_at
        line = self._waiting_for(r, k, deadline, last_call)
        log.info(line)
        if self._on_wait is not None:
            self._on_wait(WaitReport(line, WaitKind.REPLACEMENT if self._refill else WaitKind.NODES))
        return self.clock() + WAIT_REPORT_EVERY

    def _waiting_for(self, r: int, k: int, deadline: float, last_call: float | None) -> str:
        """One line on a forming round: who joined of how many, who is missing, how long until what.

        Only the first ticket names the missing nodes (an O(N) read); the others count, so a round
        of N waiting nodes costs O(N) store operations per interval.
        """
        n, now = self.node, self.clock()
        joined = min(self.store.add(self._k(f"r{r}/joined"), 0), n.max_nodes)
        if self._refill:
            lost = self._lost_reasons(r - 1) if k == 1 else {}
            what = f"group rank {', '.join(map(str, sorted(lost)))}" if lost else "the lost group ranks"
            why = f" ({'; '.join(lost.values())})" if lost else ""
            return (
                f"waiting for a node to fill {what} in round {r}{why}: {joined} joined of {n.min_nodes}; "
                f"no spare at hand; replace timeout in {max(0.0, deadline - now):.0f} s"
            )
        line = f"waiting for nodes in round {r}: {joined} joined (min {n.min_nodes}, max {n.max_nodes})"
        expected = self._expected(r)
        if expected:
            line += f", {expected} expected back from round {r - 1}"
            missing = self._missing(r, joined) if k == 1 else []
            if missing:
                more = f" and {len(missing) - MISSING_NAMED} more" if len(missing) > MISSING_NAMED else ""
                line += f"; missing: {', '.join(missing[:MISSING_NAMED])}{more}"
        if last_call is not None:
            line += f"; last call in {max(0.0, last_call - now):.0f} s"
        return line + f"; join timeout in {max(0.0, deadline - now):.0f} s"

    def _missing(self, r: int, joined: int) -> list[str]:
        """Node ids of round r - 1 that have not joined round r (those whose entries still read well)."""

        def ids(rnd: int, count: int) -> list[str]:
            found = []
            for i in range(1, count + 1):
                try:
                    node_id = _load(self.store.get(self._k(f"r{rnd}/node{i}")), "node entry").get("id")
                except RendezvousError:
                    continue
                if _addr(node_id):
                    found.append(node_id)
            return found

        here = set(ids(r, joined))
        return [i for i in ids(r - 1, self._sealed(r - 1) or 0) if i not in here]

    def _seal(self, r: int, count: int) -> None:
        """Freeze the membership at `count` tickets and write every member's plan (sealer only).

        A ticket whose entry is missing (its node died before writing it) or malformed (garbled or
        hostile) is left out, with a plan that says so; with fewer good entries than MIN, every
        ticket is left out and the round re-forms.
        """
        st = self.store
        mine = f"{count}:{self.node.node_id}".encode()
        if st.compare_set(self._k(f"r{r}/sealed"), b"", mine) != mine:
            return  # someone else sealed first
        keys = [self._k(f"r{r}/node{i}") for i in range(1, count + 1)]
        st.wait(keys, self.settings.read_timeout)  # an entry still missing then is left out
        raws = st.multi_get(keys)
        # A ticket's alive key is held before its entry is written: an entry without it is a node that died
        # (or left) while the round formed. It never enters the round.
        alive = (
            st.multi_get([self._k(f"r{r}/alive{i}") for i in range(1, count + 1)])
            if HELD & capabilities_of(st)
            else raws
        )
        good, dead = {}, 0
        for i, (raw, held) in enumerate(zip(raws, alive), 1):
            if raw and not held:
                dead += 1
                continue
            try:
                good[i] = _checked(_load(raw, "node entry"), DESC_FIELDS, "node entry")
            except RendezvousError:
                pass
        if dead:
            st.add(self._k(f"r{r}/dead"), dead)
            log.info(f"round {r}: {dead} node(s) died or left while it formed; they are left out")
        plans: dict[int, dict] = {
            i: {"left_out": "its node entry was missing or malformed, or its node died"} for i in range(1, count + 1)
        }
        if len(good) >= self.node.min_nodes:
            tickets = list(good)
            for i, plan in zip(tickets, assign(list(good.values()), st.add(self._k("restarts"), 0))):
                plan["peer"] = tickets[plan["peer"] - 1]
                plans[i] = plan
        st.multi_set([self._k(f"r{r}/plan{i}") for i in plans], [json.dumps(p).encode() for p in plans.values()])
        if len(good) < self.node.min_nodes:
            self._set_change(
                r, f"round {r} re-forms: {count - len(good)} node(s) dead, or their entries missing or malformed"
            )

    def _take_plan(self, r: int, k: int, deadline: float) -> Round | None:
        """This node's place in round r, or None when the sealer left this ticket out."""
        key = self._k(f"r{r}/plan{k}")
        # The sealer may first wait up to read_timeout for a missing entry: give it two of those.
        for _ in range(2):
            raw = self.store.wait_get(key, self._slice(deadline, self.settings.read_timeout))
            if raw is not None:
                return self._plan(r, k, raw)
        raise self._no_plan(r)

    def _no_round(self, r: int) -> RendezvousError:
        if self._refill:  # no replacement came: the job ends, on every node, with that reason
            lost = self._lost_reasons(r - 1)
            text = (
                f"no node came to fill group rank {', '.join(map(str, sorted(lost))) or '?'} within "
                f"{self.settings.replace_timeout:g} s (replace_timeout) after {'; '.join(lost.values()) or 'a loss'}"
            )
            self._set_change(r, self._close(text))
            return self._closed(self.store) or RendezvousTimeoutError(text)
        joined = self.store.add(self._k(f"r{r}/joined"), 0)
        return RendezvousTimeoutError(
            f"no round formed within {self.settings.join_timeout:g} s (join_timeout); "
            f"{joined} of {self.node.min_nodes} nodes joined"
        )

    @staticmethod
    def _no_plan(r: int) -> RendezvousTimeoutError:
        return RendezvousTimeoutError(f"round {r} was sealed but its plan never came (the sealing node died?)")

    def _plan(self, r: int, k: int, raw: bytes) -> Round | None:
        """Make ticket k's plan (`raw`) this node's round; None when the sealer left the ticket out."""
        plan = _load(raw, "plan")
        if "left_out" in plan:
            return None
        _checked(plan, PLAN_FIELDS, "plan")
        if not (
            plan["group_rank"] < plan["group_world_size"]
            and plan["rank_offset"] + self.node.nproc <= plan["world_size"]
        ):
            raise RendezvousError("rendezvous store holds a malformed plan under this job's prefix")
        self.group_rank = plan["group_rank"]
        self.peer = plan.get("peer", 0)
        self._mine = [*self._mine[-2:], (r, k, plan["group_rank"])]
        self.current = Round(
            run_id=self.run_id,
            round=r,
            restart_count=plan["restarts"],
            group_rank=plan["group_rank"],
            group_world_size=plan["group_world_size"],
            rank_offset=plan["rank_offset"],
            world_size=plan["world_size"],
            master_addr=plan["master_addr"],
            master_port=plan["master_port"],
            ifname=self.node.ifname,
        )
        return self.current

    # ------------------------------------------------------------------ rounds ending

    def _report_failure(self, r: int, verdict: Verdict | None) -> None:
        """Charge the job-wide budget once per round, whichever node reports first; close when spent,
        with this node's root cause as the job's verdict."""
        if self.store.add(self._k(f"r{r}/failed"), 1) != 1:
            return
        raw = encode_verdict(replace(verdict, node=self.node.node_id)) if verdict is not None else None
        if raw is not None:  # the others say why their round ended, restart or not
            self.store.set(self._k(f"r{r}/cause"), raw)
        used = self.store.add(self._k("restarts"), 1)
        if used > self.node.max_restarts:
            if raw is not None:
                self.store.compare_set(self._k("verdict"), b"", raw)
            reason = self._close(f"restart budget spent (--max_restarts {self.node.max_restarts})")
            self._ack()
            self._set_change(r, reason)
            raise RestartBudgetExhausted(f"no restarts left (--max_restarts {self.node.max_restarts})")

    def _watch(self, rnd: Round, post: Callable[[object], None], stop: threading.Event, peer: int) -> None:
        s = self.settings
        try:
            st = self.store.clone()
        except Exception as e:
            log.debug("the watcher could not connect to the store", exc_info=True)
            post(MembershipChanged(f"lost the rendezvous store: {e}"))
            return
        r, g, n = rnd.round, rnd.group_rank, rnd.group_world_size
        right = (g + 1) % n
        seen, seen_at = -1, self.clock()
        self._forget(st, r)
        try:
            caps = capabilities_of(st)
            if Capability.LIVENESS in caps:
                return self._watch_held(cast(LivenessStore, st), rnd, post, stop, peer)
            change = self._k(f"r{r}/change")
            alive = self._k(f"r{r}/alive{peer}") if Capability.CRASH in caps and right != g and peer else None
            while not stop.is_set():
                st.add(self._k(f"r{r}/hb{g}"), 1)
                self._publish(st, rnd, post)
                if alive is None:
                    what = Change.CHANGED if st.wait([change], s.keep_alive_interval) else None
                else:  # the same wait, cut short by the neighbour's crash
                    what = cast(LivenessStore, st).wait_change(change, alive, s.keep_alive_interval)
                if what is Change.CHANGED:
                    if not stop.is_set():
                        post(self._changed(st, r))
                    return
                if what is Change.GONE:
                    alive = None  # judged once; a finished neighbour simply went home
                    if not st.get(self._k(f"r{r}/done{right}")):
                        self._neighbour_died(st, r, n, right, "died (its connections to the store closed)")
                    continue
                if right == g or st.get(self._k(f"r{r}/done{right}")):
                    continue
                beats = st.add(self._k(f"r{r}/hb{right}"), 0)
                if beats != seen:
                    seen, seen_at = beats, self.clock()
                elif self.clock() - seen_at > s.liveness_timeout:
                    self._neighbour_died(st, r, n, right, "stopped heartbeating")
        except Exception as e:
            log.debug("the watcher lost the store", exc_info=True)
            if not stop.is_set():
                post(MembershipChanged(f"lost the rendezvous store: {e}"))
        finally:
            st.close()

    def _watch_held(
        self, st: LivenessStore, rnd: Round, post: Callable[[object], None], stop: threading.Event, peer: int
    ) -> None:
        """Liveness from the store: block until the round changes or the neighbour's alive key vanishes."""
        r, g, n = rnd.round, rnd.group_rank, rnd.group_world_size
        right = (g + 1) % n
        alive = self._k(f"r{r}/alive{peer}") if right != g and peer else None
        while not stop.is_set():
            self._publish(st, rnd, post)
            what = st.wait_change(self._k(f"r{r}/change"), alive, self.settings.keep_alive_interval)
            if what is Change.CHANGED:
                if not stop.is_set():
                    post(self._changed(st, r))
                return
            if what is Change.GONE:
                alive = None  # judged once; a finished neighbour simply went home
                if not st.get(self._k(f"r{r}/done{right}")):
                    self._neighbour_died(st, r, n, right, "lost its lease")

    def _why_changed(self, st: Store, r: int) -> str:
        """Round r's `change` reason; when it is gone (the other nodes finished and the last one out
        cleared the job's keys while this node was frozen), say so."""
        reason = (st.get(self._k(f"r{r}/change")) or b"").decode(errors="replace")
        return reason or f"round {r} ended while this node was away; the other nodes have left it"

    def _neighbour_died(self, st: Store, r: int, n: int, right: int, how: str) -> None:
        self._lost(st, r, n, right, f"node with group rank {right} {how}")

    def _forget(self, st: Store, r: int) -> None:
        """Delete this node's own per-node keys of its rounds before the last one, where the store can,
        so a long job keeps a few counters per round, not O(nodes) keys. Their `change` and `sealed`
        markers stay: a node that wakes up in an old round still learns that it ended."""
        old = [m for m in self._mine if m[0] <= r - 2]
        caps = capabilities_of(st)
        if not old or Capability.DELETE not in caps:
            return
        self._mine = [m for m in self._mine if m[0] > r - 2]
        held = ("alive",) if Capability.CRASH in caps else ()  # held for the agent's life otherwise
        try:
            cast(DeletingStore, st).delete(
                [self._k(f"r{o}/{key}{k}") for o, k, g in old for key in ("node", "plan", *held)]
                + [self._k(f"r{o}/{key}{g}") for o, k, g in old for key in ("hb", "snap")]
            )
        except Exception:  # tidying must never disturb the job
            log.debug("deleting old rounds' keys failed", exc_info=True)

    def _publish(
        self, st: Store, rnd: Round, post: Callable[[object], None] | None = None, force: bool = False
    ) -> None:
        """This node's snapshot under `r<r>/snap<g>`, at most every SNAPSHOT_EVERY s; then the stragglers
        (judged by group rank 0 over every snapshot: O(N) reads, one write; read by each node: one
        get). Never fails the job."""
        if self._report is None or (not force and self.clock() - self._reported_at < SNAPSHOT_EVERY):
            return
        try:
            mine = self._report()
            if mine is None:  # the node is still starting this round's workers: publish once they run
                return
            self._reported_at = self.clock()
            snap = {**mine, "node": self.node.node_id, "group_rank": rnd.group_rank, "time": time.time()}
            raw = json.dumps(snap).encode()
            if len(raw) > MAX_VALUE:  # a node of very many workers: the node's line without them
                raw = json.dumps({**snap, "workers": []}).encode()
            st.set(self._k(f"r{rnd.round}/snap{rnd.group_rank}"), raw)
            if post is not None and self.judge is not None and self.judge.threshold:
                self._stragglers(st, rnd, post)
            if post is not None and rnd.group_rank == 0:
                self._judge_spares(st, rnd.round, post)
        except Exception:
            log.debug("publishing this node's snapshot failed", exc_info=True)

    def _stragglers(self, st: Store, rnd: Round, post: Callable[[object], None]) -> None:
        key = self._k(f"r{rnd.round}/stragglers")
        if rnd.group_rank == 0 and self.judge is not None:
            snaps = (read_snapshot(st.get(self._k(f"r{rnd.round}/snap{g}"))) for g in range(rnd.group_world_size))
            flagged = self.judge(running_rates(snaps), self.clock())
            if flagged is not None:
                st.set(
                    key,
                    json.dumps(
                        {"median": flagged.median, "ranks": {str(k): v for k, v in flagged.ranks.items()}}
                    ).encode(),
                )
        try:
            raw = st.get(key)
            value = _load(raw, "straggler list") if raw is not None else {"median": 0.0, "ranks": {}}
            ranks = {int(k): float(v) for k, v in value["ranks"].items() if k.isdigit() and len(k) <= 9 and _number(v)}
            median = float(value["median"]) if _number(value["median"]) else 0.0
        except (RendezvousError, KeyError, AttributeError, TypeError):
            return
        if frozenset(ranks) != self._flagged:
            self._flagged = frozenset(ranks)
            post(Stragglers(median, ranks))

    def _changed(self, st: Store, r: int) -> MembershipChanged:
        """The round ended: why, and whether the job was closed (read, acknowledged and kept now: the
        store host may go as soon as every node has acknowledged)."""
        reason = self._why_changed(st, r)[:300]
        closed = self._closed(st) is not None
        raw = None if closed else st.get(self._k(f"r{r}/cause"))
        if raw is not None:
            try:
                cause = decode_verdict(raw)
            except RendezvousError as e:
                log.debug(f"{e}; ignored")
            else:
                reason = f"{cause.describe()}" + (f": {cause.error}" if cause.error else "") + f", node {cause.node}"
                return MembershipChanged(reason, failed=True)
        return MembershipChanged(reason, closed=closed)

    def _wait_acks(self, rnd: Round, at_most: float | None = None) -> None:
        """The store host, at a closed job's end: keep the store up until every live member of the
        last round read the verdict (each sets `acked<k>`), or exit_barrier_timeout (or `at_most`)."""
        deadline = self.clock() + min(self.settings.exit_barrier_timeout, at_most or float("inf"))
        while self.clock() < deadline:
            live = rnd.group_world_size - self.store.add(self._k(f"r{rnd.round}/left"), 0)
            live += self._live_spares(self.store)
            if self.store.wait([self._k(f"acked{k}") for k in range(1, live + 1)], self._slice(deadline, 0.5)):
                return

    def _ack(self, store: Store | None = None) -> None:
        st = store or self.store
        with self._ack_lock:
            if not self._acked:
                self._acked = True
                st.set(self._k(f"acked{st.add(self._k('acks'), 1)}"), b"1")

    def _wait_finished(self, rnd: Round) -> None:
        key = self._k(f"r{rnd.round}/finished")
        deadline = self.clock() + self.settings.exit_barrier_timeout
        while self.store.add(key, 0) < rnd.group_world_size and self.clock() < deadline:
            if self.store.wait([self._k(f"r{rnd.round}/change")], 0.2):
                return  # someone left or failed: nobody else will finish this round

    # ------------------------------------------------------------------ small steps

    def _k(self, key: str) -> str:
        return self.prefix + key

    def _slice(self, deadline: float, at_most: float) -> float:
        return max(0.001, min(at_most, deadline - self.clock()))

    def _look(self, first: bool = False) -> int:
        """The job's current round, read in one request with its `closed` mark (raised when set) and,
        on this node's first join, its token check."""
        keys = ["round", "closed", "token"] if first else ["round", "closed"]
        values = self.store.multi_get([self._k(key) for key in keys])
        if first:
            self._check_token(values[2] or None)
        if values[1]:
            self._check_closed()
        if not values[0]:  # the job's first node: create the counter (or learn who did)
            return self._current_round()
        return parse_count(values[0], "round number")

    def _check_token(self, theirs: bytes | None) -> None:
        """The first node sets the job's token check (an HMAC of the run id, never the token); others must match."""
        token, mine = self.node.token, token_check(self.node.token, self.run_id)
        if theirs is None:
            theirs = self.store.compare_set(self._k("token"), b"", mine)
        if theirs == mine:
            return
        if not token:
            raise RendezvousError(
                f"job {self.run_id!r} needs a join token: set LAUNCHER_JOIN_TOKEN (or --rdzv_conf join_token_file=PATH) as on its other nodes"
            )
        if theirs == b"none":
            raise RendezvousError(
                f"job {self.run_id!r} was started without a join token, but this node has one; use the same setting on every node"
            )
        raise RendezvousError(
            f"wrong join token for job {self.run_id!r}: this node's LAUNCHER_JOIN_TOKEN differs from the other nodes'"
        )

    def _current_round(self) -> int:
        return parse_count(self.store.compare_set(self._k("round"), b"", b"0"), "round number")

    def _advance(self, r: int) -> None:
        self.store.compare_set(self._k("round"), str(r).encode(), str(r + 1).encode())

    def _sealed(self, r: int) -> int | None:
        return sealed_members(self.store.get(self._k(f"r{r}/sealed")))

    def _expected(self, r: int) -> int:
        """Nodes expected back in round r: the last round's members, less those lost or dead, plus the
        nodes that waited (late joiners and spares, less the spares found dead)."""
        if r == 0:
            return 0
        prev = self._sealed(r - 1)
        if prev is None:
            return 0
        left = self.store.add(self._k(f"r{r - 1}/left"), 0)
        dead = self.store.add(self._k(f"r{r - 1}/dead"), 0)
        waiting = self.store.add(self._k(f"r{r - 1}/waiting"), 0)
        return max(0, prev - left - dead + waiting)

    def _wait_for(self, r: int, deadline: float) -> int:
        while not self.store.wait([self._k(f"r{r}/sealed")], self._slice(deadline, 1.0)):
            self._check_closed()
            if self.clock() >= deadline:
                raise RendezvousTimeoutError(f"round {r} did not form within the join timeout")
        return self._sealed(r) or 0

    def _set_change(self, r: int, reason: str, store: Store | None = None) -> None:
        (store or self.store).compare_set(self._k(f"r{r}/change"), b"", reason.encode())

    def _close(self, reason: str, store: Store | None = None) -> str:
        """Close the job for everyone (first closer wins); returns the reason as written."""
        text = f"{reason}; closed by node {self.node.node_id}"
        (store or self.store).compare_set(self._k("closed"), b"", text.encode())
        return text

    def _check_closed(self) -> None:
        """Raise RendezvousClosedError, with the job's verdict, once the job is closed."""
        closed = self._seen_closed or self._closed(self.store)
        if closed is not None:
            raise closed

    def _closed(self, st: Store) -> RendezvousClosedError | None:
        """The job's close as an error with its verdict, once closed (then kept); the host is told it was read."""
        if self._seen_closed is not None:
            return self._seen_closed
        reason = st.get(self._k("closed"))
        if not reason:
            return None
        verdict = None
        raw = st.get(self._k("verdict"))
        if raw is not None:
            try:
                verdict = decode_verdict(raw)
            except RendezvousError as e:
                log.warning(f"{e}; ignored")
        self._seen_closed = RendezvousClosedError(
            f"the job was closed: {reason[:300].decode(errors='replace')}",
            verdict,
            succeeded=reason.startswith(FINISHED.encode()),
        )
        try:
            self._ack(st)
        except Exception:  # the host may be gone already: it waits for nobody then
            log.debug("telling the store host the verdict was read failed", exc_info=True)
        return self._seen_closed


def token_check(token: str | None, run_id: str) -> bytes:
    """What the store keeps under `token`: an HMAC of the run id with the join token, or `none`."""
    if not token:
        return b"none"
    import hmac  # loads OpenSSL: only for a job with a token

    return hmac.new(token.encode(), f"launcher-join:{run_id}".encode(), "sha256").hexdigest().encode()


def assign(descs: list[dict], restarts: int) -> list[dict]:
    """Plans for one sealed round: nodes keep last round's group rank where they can; ranks follow."""
    n = len(descs)
    ranks: list[int | None] = [None] * n
    taken: set[int] = set()
    for i, d in enumerate(descs):
        prev = d.get("prev", -1)
        if isinstance(prev, int) and 0 <= prev < n and prev not in taken:
            ranks[i] = prev
            taken.add(prev)
    free = iter(sorted(set(range(n)) - taken))
    ranks = [r if r is not None else next(free) for r in ranks]
    by_rank = sorted(range(n), key=lambda i: ranks[i])
    offsets, total = {}, 0
    for i in by_rank:
        offsets[i] = total
        total += descs[i]["nproc"]
    master = descs[by_rank[0]]
    return [
        {
            "group_rank": ranks[i],
            "group_world_size": n,
            "rank_offset": offsets[i],
            "world_size": total,
            "master_addr": master["addr"],
            "master_port": master["port"],
            "restarts": restarts,
            "peer": by_rank[(ranks[i] + 1) % n] + 1,  # the right-hand neighbour's ticket
        }
        for i in range(n)
    ]


# What the protocol reads back is checked field by field: the store is shared, so a value under the
# job's prefix may be garbled or hostile (bool is not an int here: JSON `true` is no rank).
def _int(lo: int, hi: int) -> Callable[[object], bool]:
    return lambda v: type(v) is int and lo <= v < hi


def _addr(v: object) -> bool:
    return type(v) is str and 0 < len(v) <= 255 and v.isprintable() and " " not in v


DESC_FIELDS = {"addr": _addr, "port": _int(1, 65536), "nproc": _int(1, 1 << 20), "prev": _int(-1, 1 << 31)}
PLAN_FIELDS = {
    "group_rank": _int(0, 1 << 31),
    "group_world_size": _int(1, 1 << 31),
    "rank_offset": _int(0, 1 << 31),
    "world_size": _int(1, 1 << 31),
    "master_addr": _addr,
    "master_port": _int(1, 65536),
    "restarts": _int(0, 1 << 31),
}


def _number(v: object) -> bool:
    return type(v) in (int, float) and v == v and abs(v) < 1e12  # type: ignore[operator]


def _text(limit: int) -> Callable[[object], bool]:
    return lambda v: type(v) is str and len(v) <= limit and v.isprintable()


VERDICT_LIMITS = {"host": 255, "node": 255, "error": 300, "log": 1024}
VERDICT_FIELDS = {
    **{name: _text(limit) for name, limit in VERDICT_LIMITS.items()},
    "rank": _int(0, 1 << 31),
    "local_rank": _int(0, 1 << 20),
    "returncode": _int(-255, 256),
    "round": _int(0, 1 << 31),
}


def encode_verdict(v: Verdict) -> bytes:
    """The verdict as the store keeps it: JSON, its text fields cut to their limits and made printable."""
    fields = {name: getattr(v, name) for name in VERDICT_FIELDS}
    for name, limit in VERDICT_LIMITS.items():
        fields[name] = "".join(c if c.isprintable() else " " for c in fields[name])[:limit]
    return json.dumps(fields).encode()


def decode_verdict(raw: bytes) -> Verdict:
    """A verdict read back from the store, checked field by field; anything else is a RendezvousError."""
    if len(raw) > MAX_VERDICT:
        raise RendezvousError("rendezvous store holds an oversized verdict under this job's prefix")
    value = _checked(_load(raw, "verdict"), VERDICT_FIELDS, "verdict")
    return Verdict(**{name: value[name] for name in VERDICT_FIELDS})


# A node's snapshot (`launcher status`, the straggler judge): checked like every value read back.
WORKER_FIELDS = {"rank": int, "local_rank": int, "pid": int, "state": str, "restarts": int}
OPTIONAL_WORKER_FIELDS = {"progress_age": (int, float), "step": int, "rate": (int, float), "straggler": bool}
NODE_FIELDS = {"host": str, "state": str, "round": int, "restarts": int, "max_restarts": int, "time": (int, float)}


def read_snapshot(raw: bytes | None) -> dict | None:
    """One node's snapshot, field by field; a missing or hostile one is left out."""
    try:
        value = _load(raw, "snapshot")
    except RendezvousError:
        return None
    if not (_addr(value.get("node")) and _fields_ok(value, NODE_FIELDS) and isinstance(value.get("workers"), list)):
        return None
    snap = {name: value[name] for name in (*NODE_FIELDS, "node")}
    snap["workers"] = [_worker(w) for w in value["workers"][:1024] if _worker(w) is not None]
    return snap


def _worker(w: object) -> dict | None:
    if not isinstance(w, dict) or not _fields_ok(w, WORKER_FIELDS):
        return None
    out = {name: w[name] for name in WORKER_FIELDS}
    for name, kind in OPTIONAL_WORKER_FIELDS.items():
        v = w.get(name)
        out[name] = v if isinstance(v, kind) and not (kind is not bool and isinstance(v, bool)) else None
    return out


def _fields_ok(value: dict, fields: dict) -> bool:
    for name, kind in fields.items():
        v = value.get(name)
        if (
            not isinstance(v, kind)
            or isinstance(v, bool)
            or (isinstance(v, str) and not (len(v) <= 255 and v.isprintable()))
        ):
            return False
    return True


def _load(raw: bytes | None, what: str) -> dict:
    """A JSON object from the store; a missing, oversized or garbled value is a clear error."""
    if raw is None or len(raw) > MAX_VALUE:
        raise RendezvousError(f"rendezvous store holds a missing or oversized {what} under this job's prefix")
    try:
        value = json.loads(raw)
    except ValueError:
        raise RendezvousError(f"rendezvous store holds a {what} that is not JSON under this job's prefix") from None
    if not isinstance(value, dict):
        raise RendezvousError(f"rendezvous store holds a malformed {what} under this job's prefix")
    return value


def _checked(value: dict, fields: dict[str, Callable[[object], bool]], what: str) -> dict:
    if not all(name in value and ok(value[name]) for name, ok in fields.items()):
        raise RendezvousError(f"rendezvous store holds a malformed {what} under this job's prefix")
    return value


@dataclass(frozen=True)
class Spare:
    """A registered spare, as `launcher status` and the spares' judge read it."""

    number: int
    node: str
    host: str
    since: float  # epoch seconds it registered
    alive: bool  # its alive key is held (always True on a store that cannot tell)


def read_spares(store: Store, key: Callable[[str], str], count: int) -> list[Spare]:
    """The spares registered under `key` (1..count) whose entries are still there: 2 x count reads in one."""
    if count <= 0:
        return []
    count = min(count, 1 << 16)
    held = bool(HELD & capabilities_of(store))
    names = [key(f"spare{j}") for j in range(1, count + 1)]
    raws = store.multi_get(names + ([key(f"sparealive{j}") for j in range(1, count + 1)] if held else []))
    found = []
    for j in range(1, count + 1):
        try:
            entry = _load(raws[j - 1], "spare entry") if raws[j - 1] else None
        except RendezvousError:
            continue
        if entry is None or not (_addr(entry.get("node")) and _addr(entry.get("host")) and _number(entry.get("since"))):
            continue
        found.append(
            Spare(j, entry["node"], entry["host"], float(entry["since"]), not held or bool(raws[count + j - 1]))
        )
    return found


def sealed_members(raw: bytes | None) -> int | None:
    """How many nodes a round's `sealed` value says it has (None: not sealed yet)."""
    return parse_count(raw.split(b":", 1)[0], "seal") if raw else None


def parse_count(raw: bytes, what: str) -> int:
    """A round number or seal count written by the protocol: a small decimal, or a clear error."""
    if not (raw.isdigit() and len(raw) <= 9):
        raise RendezvousError(f"rendezvous store holds a malformed {what} under this job's prefix")
    return int(raw)
