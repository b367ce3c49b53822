"""The elastic rendezvous protocol, the same on every store.

A job is a sequence of rounds. In round r every node takes a ticket (an atomic counter), writes
one small descriptor, and the round is *sealed* once MAX nodes joined, or once the nodes expected
from the last round are back, or once the last call after MIN nodes ran out. The sealer alone
reads the descriptors and writes one plan key per node (ranks, world, bootstrap address), so a
round costs O(N) store operations in total; nobody rewrites a shared blob. A node joins in five
calls: one read (round, closed, token, epoch), its ticket, its alive key, its descriptor, and a wait that
returns its plan (a ticket below MIN is in every seal, so it waits for its plan directly).

A sealed round ends when any node writes its `change` key: a worker failed (charged once to the
job-wide restart budget), a node died (`watch.RoundWatch` judges the right-hand neighbour), a late
node wants in, or a node left. A member lost (dead or gone) is one rule (`losses.Losses`); a node
beyond MAX waits as a spare and takes a lost member's group rank (`spares`). The store interface is
`store.Store`, the keys `keys.Keys`, the values `records`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import cast

from ..errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousTimeoutError,
    RestartBudgetExhausted,
)
from ..spec import Round, Verdict
from .api import FINISHED, JOB_FINISHED, Cause, MembershipChanged, WaitKind, WaitReport, budget_spent
from .keys import Keys
from .losses import Losses
from .records import (
    LEFT_OUT,
    Node,
    assign,
    decode_descriptor,
    decode_plan,
    decode_verdict,
    encode_descriptor,
    encode_plan,
    encode_verdict,
    failure_text,
    parse_count,
    printable,
    sealed_members,
    token_check,
    token_refusal,
)
from .rerun import enter_epoch
from .settings import RendezvousSettings
from .spares import Orphaned, SpareJudge, SpareSeat, live_spares, wait_spares_read, yield_to_members
from .store import HELD, LivenessStore, Store, capabilities_of
from .waiting import nodes_line
from .watch import RoundWatch, forget_old_rounds

log = logging.getLogger(__name__)
WAIT_REPORT_EVERY = 5.0  # seconds between the lines that say what a forming round waits for
HOST_LEAVING_WAIT = 10.0  # a store host that leaves a running job (a signal) waits at most this for the readers
LOOK_EVERY = 1.0  # seconds between a would-be sealer's looks at a forming round's count
NO_PLAN = "round {} was sealed but its plan never came (the sealing node died?)"


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
    ):
        self.store = store
        self.node = node
        self.settings = settings
        self.pick_port = port_picker
        self.kept_port = 0  # the bootstrap port this node offers instead of a fresh one (0: none; `offer_port`)
        self.is_host = is_host
        self.clock = clock
        self.keys = Keys(run_id)
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
        self.seat = SpareSeat(self.keys, node.node_id)  # this node's registration while it waits as a spare
        self.spare_judge = SpareJudge(self.keys, clock)  # run by the node with group rank 0
        self.losses = Losses(self.keys, node, self._close, self._set_change)
        self._forming: tuple[int, int] | None = None  # (round, ticket) while this node holds a forming round's ticket
        self._last: Round | None = None  # the round this node left last (gone while re-forming: lost from it)
        self._refill = False  # the forming round lost members and is below MIN: it waits replace_timeout

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
                self._set_change(r, cause.change(self.node.node_id))
                self._advance(r)
                self._last, self.current = self.current, None
                r = self._look()
            return self._join(r)
        except RendezvousError:  # RestartBudgetExhausted is one too
            raise
        except Exception as e:  # a store that went away mid-protocol
            raise RendezvousConnectionError(f"rendezvous store failed: {e}") from e

    def watch(self, rnd: Round, post: Callable[[object], None]) -> None:
        """Watch `rnd` on a thread of its own (`watch.RoundWatch`): post MembershipChanged when it ends."""
        self._stop_watch = stop = threading.Event()
        watch = RoundWatch(
            self.store,
            self.keys,
            rnd,
            self.peer,
            self.settings.keep_alive_interval,
            self.settings.liveness_timeout,
            self.clock,
            ended=self._changed,
            died=self._neighbour_died,
            tidy=self._forget,
            tick=lambda st: self.spare_judge.tick(st, rnd, post),
        )
        self._watcher = threading.Thread(target=watch.run, args=(stop, post), name="launcher-rdzv-watch", daemon=True)
        self._watcher.start()

    def offer_port(self, port: int) -> None:
        """Offer `port` (0: a fresh one) as the bootstrap port of the rounds it joins (--recovery in-place)."""
        self.kept_port = port

    def shared_store(self) -> Store:
        """The job's store (the job board keeps its records there too)."""
        return self.store

    def shutdown(self, succeeded: bool, why: str = "") -> None:
        """Finished: mark done (the store host waits for the others). Failed or signalled: leave the round."""
        self._stop_watch.set()
        rnd = self.current
        if rnd is None:
            return self._leave_waiting(succeeded, why)
        try:
            r, g = rnd.round, rnd.group_rank
            if succeeded:
                self.store.set(self.keys.done(r, g), b"1")
                if self.losses.finish(self.store, r, rnd.group_world_size):  # the last one: the job is done
                    # A late node stops; the spares wake (the round's change) and end with exit 0.
                    self._set_change(r, JOB_FINISHED)
                if self.is_host:  # the others still need the store: wait for them (exit barrier), then the spares
                    self._wait_finished(rnd)
                    wait_spares_read(self.store, self.keys, HOST_LEAVING_WAIT)
            elif not self.store.get(self.keys.closed):
                left = f"{self.node.node_id} left" + (f": {why}" if why else "")
                if self.is_host:  # the store goes with this node: the job ends, and the others learn why
                    self._set_change(r, self._close(f"the node hosting the store ({left})"))
                    self._ack()
                    self._wait_acks(rnd, HOST_LEAVING_WAIT)
                else:
                    self.losses.lost(self.store, r, rnd.group_world_size, g, left)
            elif self.is_host:  # the others still read the verdict from this store: wait for them
                self._wait_acks(rnd)
        except Exception:  # leaving must never fail the exit
            log.debug("leaving the rendezvous failed", exc_info=True)
        finally:
            if self._watcher:
                self._watcher.join(self.settings.keep_alive_interval + 1.0)

    def _leave_waiting(self, succeeded: bool, why: str) -> None:
        """Leave while in no round, on a connection of its own (the joining thread may be in a wait): give a
        forming round's ticket up (`Losses.left_forming`), or the spare's seat; a closed job is just over."""
        if (self._forming is None and not self.seat.number) or self._seen_closed is not None:
            return
        try:
            st = self.store.clone()
        except Exception:  # the store is gone: nothing to tell it
            log.debug("leaving the rendezvous failed", exc_info=True)
            return
        try:
            if self._forming is not None:
                self.losses.left_forming(st, self._forming, self._last, "" if succeeded else why or "gave up")
            if self.seat.number:
                self.seat.leave(st, "" if succeeded else why)
        except Exception:  # leaving must never fail the exit
            log.debug("leaving the rendezvous failed", exc_info=True)
        finally:
            st.close()

    def close(self, verdict: Verdict | None, reason: str) -> None:
        """The restart policy stopped the job here: publish `verdict` as the job's (its code for every
        node), close the job and end the round, so the others stop too (no restart is charged)."""
        rnd = self.current
        if rnd is None:
            return
        try:
            if verdict is not None:
                self.store.compare_set(self.keys.verdict, b"", encode_verdict(replace(verdict, node=self.node.node_id)))
            self._set_change(rnd.round, self._close(reason))
            self._ack()
        except Exception as e:  # the exit code and the line still say it here; the others time out
            log.warning(f"could not close the job in the rendezvous store: {e}")
            log.debug("closing the job failed", exc_info=True)

    # ------------------------------------------------------------------ joining

    def _join(self, r: int) -> Round:
        """Take a ticket in round r (the job not closed: `_look` just read it) and wait for its plan;
        a node that came too late asks for a new round, or waits as a spare when the round is full."""
        s, st = self.settings, self.store
        while True:
            self._refill = self.losses.refilling(st, r)
            deadline = self.clock() + (s.replace_timeout if self._refill else s.join_timeout)
            if self.seat.number:  # the members expected back take the first tickets
                yield_to_members(st, self.keys, r, self.node.max_nodes, s.last_call_timeout, self.clock)
            k = st.add(self.keys.joined(r), 1)
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
                    cast(LivenessStore, st).hold(self.keys.alive(r, k))
                port = self.kept_port or self.pick_port()
                desc = encode_descriptor(self.node.node_id, self.node.addr, port, self.node.nproc, self.group_rank)
                st.set(self.keys.node(r, k), desc)
                if k < self.node.min_nodes:  # it never seals: it waits for its plan, nothing else
                    rnd = self._wait_plan(r, k, deadline)
                else:
                    self._wait_sealed(r, k, deadline)
                    sealed = self._sealed(r)
                    rnd = self._take_plan(r, k, deadline) if sealed is not None and k <= sealed else None
                self._forming = None
                if rnd is not None:
                    if self.seat.number:
                        self.seat.joined(st, r, self.losses.reasons(st, r - 1) if r > 0 else {})
                    return rnd  # else the sealer left this ticket out: as if it came too late
            if sealed is None:
                sealed = self._wait_for(r, deadline)
            # The round formed without this node: ask for a new one, or wait as a spare when full.
            if sealed < self.node.max_nodes:
                st.add(self.keys.waiting(r), 1)
                self._set_change(r, f"{self.node.node_id} wants to join")
            else:
                self._wait_as_spare(r, sealed)
            self._advance(r)
            r = self._look()

    def _wait_as_spare(self, r: int, sealed: int) -> None:
        """Round r is full: wait as a spare (`spares.SpareSeat.wait`) for it to end; raise once closed."""
        gone = lambda: self.losses.all_lost(self.store, r, sealed, self.node.node_id)  # noqa: E731
        orphaned = Orphaned(self.keys, r, sealed, self.settings.liveness_timeout, self.clock, gone)
        if self.seat.wait(self.store, r, sealed, self._on_wait, self._check_closed, orphaned):
            self.group_rank = -1  # a spare takes the group rank that is free, never an old one of its own

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
                [self.keys.sealed(r)], self._slice(deadline, max(0.001, min(LOOK_EVERY, last_call - self.clock())))
            ):
                return
            self._check_closed()
            if self.clock() >= deadline:
                raise self._no_round(r)
            report_at = self._tell_waiting(r, k, deadline, last_call, report_at)
            count = min(st.add(self.keys.joined(r), 0), n.max_nodes)

    def _wait_plan(self, r: int, k: int, deadline: float) -> Round | None:
        """A ticket below MIN: wait for its plan directly. Every WAIT_REPORT_EVERY s it says what
        the round waits for and reads `closed` and `sealed` in one request: the job may have closed,
        the sealer may have died before writing the plans (given two read_timeouts), or a node of
        another MIN may have sealed below this ticket. A forming round of N nodes thus costs O(N)
        store operations per interval, and none between."""
        key = self.keys.plan(r, k)
        report_at, sealed_at = self.clock() + WAIT_REPORT_EVERY, None
        while (raw := self.store.wait_get(key, self._slice(deadline, max(0.001, report_at - self.clock())))) is None:
            closed, sealed = self.store.multi_get([self.keys.closed, self.keys.sealed(r)])
            if closed:
                self._check_closed()
            count = sealed_members(sealed)
            if count is not None and k > count:
                return None  # sealed below this ticket
            if count is not None:
                sealed_at = sealed_at if sealed_at is not None else self.clock()
                if self.clock() - sealed_at > 2 * self.settings.read_timeout:
                    raise RendezvousTimeoutError(NO_PLAN.format(r))
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
        """One line on what round r waits for: nodes (`waiting.nodes_line`), or replacements."""
        now = self.clock()
        joined = min(self.store.add(self.keys.joined(r), 0), self.node.max_nodes)
        if self._refill:
            return self.losses.waiting_line(self.store, r, k, joined, deadline - now)
        call_in = None if last_call is None else last_call - now
        return nodes_line(self.store, self.keys, self.node, r, k, joined, self._expected(r), call_in, deadline - now)

    def _seal(self, r: int, count: int) -> None:
        """Freeze the membership at `count` tickets and write every member's plan (sealer only).

        A ticket whose entry is missing (its node died before writing it) or malformed (garbled or
        hostile) is left out, with a plan that says so; with fewer good entries than MIN, every
        ticket is left out and the round re-forms.
        """
        st = self.store
        mine = f"{count}:{self.node.node_id}".encode()
        if st.compare_set(self.keys.sealed(r), b"", mine) != mine:
            return  # someone else sealed first
        keys = [self.keys.node(r, i) for i in range(1, count + 1)]
        st.wait(keys, self.settings.read_timeout)  # an entry still missing then is left out
        raws = st.multi_get(keys)
        # A ticket's alive key is held before its entry is written: an entry without it is a node that
        # died (or left) while the round formed. It never enters the round.
        held = HELD & capabilities_of(st)
        alive = st.multi_get([self.keys.alive(r, i) for i in range(1, count + 1)]) if held else raws
        good, dead = {}, 0
        for i, (raw, mark) in enumerate(zip(raws, alive), 1):
            if raw and not mark:
                dead += 1
                continue
            try:
                good[i] = decode_descriptor(raw)
            except RendezvousError:
                pass
        if dead:
            st.add(self.keys.dead(r), dead)
            log.info(f"round {r}: {dead} node(s) died or left while it formed; they are left out")
        plans: dict[int, dict] = dict.fromkeys(range(1, count + 1), LEFT_OUT)
        if len(good) >= self.node.min_nodes:
            tickets = list(good)
            for i, plan in zip(tickets, assign(list(good.values()), st.add(self.keys.restarts, 0))):
                plan["peer"] = tickets[plan["peer"] - 1]
                plans[i] = plan
        st.multi_set([self.keys.plan(r, i) for i in plans], [encode_plan(p) for p in plans.values()])
        if len(good) < self.node.min_nodes:
            self._set_change(r, f"round {r} re-forms: {count - len(good)} node(s) dead, or their entries bad")

    def _take_plan(self, r: int, k: int, deadline: float) -> Round | None:
        """This node's place in round r, or None when the sealer left this ticket out."""
        key = self.keys.plan(r, k)
        # The sealer may first wait up to read_timeout for a missing entry: give it two of those.
        for _ in range(2):
            raw = self.store.wait_get(key, self._slice(deadline, self.settings.read_timeout))
            if raw is not None:
                return self._plan(r, k, raw)
        raise RendezvousTimeoutError(NO_PLAN.format(r))

    def _no_round(self, r: int) -> RendezvousError:
        if self._refill:  # no replacement came: the job ends, on every node, with that reason
            text = self.losses.no_replacement(self.store, r, self.settings.replace_timeout)
            self._set_change(r, self._close(text))
            return self._closed(self.store) or RendezvousTimeoutError(text)
        joined = self.store.add(self.keys.joined(r), 0)
        return RendezvousTimeoutError(
            f"no round formed within {self.settings.join_timeout:g} s (join_timeout); "
            f"{joined} of {self.node.min_nodes} nodes joined"
        )

    def _plan(self, r: int, k: int, raw: bytes) -> Round | None:
        """Make ticket k's plan (`raw`) this node's round; None when the sealer left the ticket out."""
        plan = decode_plan(raw, self.node.nproc)
        if plan is None:
            return None
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
        if self.store.add(self.keys.failed(r), 1) != 1:
            return
        raw = encode_verdict(replace(verdict, node=self.node.node_id)) if verdict is not None else None
        if raw is not None:  # the others say why their round ended, restart or not
            self.store.set(self.keys.cause(r), raw)
        if budget_spent(self.store.add(self.keys.restarts, 1), self.node.max_restarts):
            if raw is not None:
                self.store.compare_set(self.keys.verdict, b"", raw)
            reason = self._close(f"restart budget spent (--max_restarts {self.node.max_restarts})")
            self._ack()
            self._set_change(r, reason)
            raise RestartBudgetExhausted(f"no restarts left (--max_restarts {self.node.max_restarts})")

    def _why_changed(self, st: Store, r: int) -> str:
        """Round r's `change` reason; when it is gone (the other nodes finished and the last one out
        cleared the job's keys while this node was frozen), say so."""
        reason = printable(st.get(self.keys.change(r)) or b"")
        return reason or f"round {r} ended while this node was away; the other nodes have left it"

    def _neighbour_died(self, st: Store, r: int, n: int, right: int, how: str) -> None:
        self.losses.lost(st, r, n, right, f"node with group rank {right} {how}")

    def _forget(self, st: Store, r: int) -> None:
        self._mine = forget_old_rounds(st, self.keys, self._mine, r)

    def _changed(self, st: Store, r: int) -> MembershipChanged:
        """The round ended: why, and whether the job was closed (read, acknowledged and kept now: the
        store host may go as soon as every node has acknowledged)."""
        reason = self._why_changed(st, r)[:300]
        closed = self._closed(st) is not None
        failure = None if closed else failure_text(st.get(self.keys.cause(r)))
        if failure is not None:
            return MembershipChanged(failure, failed=True)
        return MembershipChanged(reason, closed=closed)

    def _wait_acks(self, rnd: Round, at_most: float | None = None) -> None:
        """The store host, at a closed job's end: keep the store up until every live member of the
        last round read the verdict (each sets `acked<k>`), or exit_barrier_timeout (or `at_most`)."""
        deadline = self.clock() + min(self.settings.exit_barrier_timeout, at_most or float("inf"))
        while self.clock() < deadline:
            live = rnd.group_world_size - self.store.add(self.keys.left(rnd.round), 0)
            live += live_spares(self.store, self.keys)
            if self.store.wait([self.keys.acked(k) for k in range(1, live + 1)], self._slice(deadline, 0.5)):
                return

    def _ack(self, store: Store | None = None) -> None:
        st = store or self.store
        with self._ack_lock:
            if not self._acked:
                self._acked = True
                st.set(self.keys.acked(st.add(self.keys.acks, 1)), b"1")

    def _wait_finished(self, rnd: Round) -> None:
        key = self.keys.finished(rnd.round)
        deadline = self.clock() + self.settings.exit_barrier_timeout
        while self.store.add(key, 0) < rnd.group_world_size and self.clock() < deadline:
            if self.store.wait([self.keys.change(rnd.round)], 0.2):
                return  # someone left or failed: nobody else will finish this round

    # ------------------------------------------------------------------ small steps

    def _slice(self, deadline: float, at_most: float) -> float:
        return max(0.001, min(at_most, deadline - self.clock()))

    def _look(self, first: bool = False) -> int:
        """The round, read with `closed` (raised when set); on a first join, the token and epoch (`rerun`)."""
        k = self.keys
        values = self.store.multi_get([k.round, k.closed, k.token, k.epoch_key] if first else [k.round, k.closed])
        if first:
            self._check_token(values[2] or None)
            if enter_epoch(self.store, k, values[3], values[:2], self.node.max_nodes):
                values = self.store.multi_get([k.round, k.closed])
        if values[1]:
            self._check_closed()
        if not values[0]:  # the job's first node: create the counter (or learn who did)
            return parse_count(self.store.compare_set(k.round, b"", b"0"), "round number")
        return parse_count(values[0], "round number")

    def _check_token(self, theirs: bytes | None) -> None:
        """A node with a token sets the token check (an HMAC of the run id); a token-less one never writes."""
        mine = token_check(self.node.token, self.run_id)
        if self.node.token and theirs in (None, b"none"):
            theirs = self.store.compare_set(self.keys.token, theirs or b"", mine)
        if theirs != mine if self.node.token else theirs not in (None, b"none"):
            raise RendezvousError(token_refusal(theirs or b"none", self.node.token, self.run_id))

    def _advance(self, r: int) -> None:
        self.store.compare_set(self.keys.round, str(r).encode(), str(r + 1).encode())

    def _sealed(self, r: int) -> int | None:
        return sealed_members(self.store.get(self.keys.sealed(r)))

    def _expected(self, r: int) -> int:
        """Nodes expected back in round r: the last round's members, less those lost or dead, plus the
        nodes that waited (late ones and spares, less the spares found dead)."""
        if r == 0:
            return 0
        prev = self._sealed(r - 1)
        if prev is None:
            return 0
        left = self.store.add(self.keys.left(r - 1), 0)
        dead = self.store.add(self.keys.dead(r - 1), 0)
        waiting = self.store.add(self.keys.waiting(r - 1), 0)
        return max(0, prev - left - dead + waiting)

    def _wait_for(self, r: int, deadline: float) -> int:
        while not self.store.wait([self.keys.sealed(r)], self._slice(deadline, 1.0)):
            self._check_closed()
            if self.clock() >= deadline:
                raise RendezvousTimeoutError(f"round {r} did not form within the join timeout")
        return self._sealed(r) or 0

    def _set_change(self, r: int, reason: str, store: Store | None = None) -> None:
        (store or self.store).compare_set(self.keys.change(r), b"", reason.encode())

    def _close(self, reason: str, store: Store | None = None) -> str:
        """Close the job for everyone (first closer wins); returns the reason as written."""
        text = f"{reason}; closed by node {self.node.node_id}"
        (store or self.store).compare_set(self.keys.closed, b"", text.encode())
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
        reason = st.get(self.keys.closed)
        if not reason:
            return None
        verdict = None
        raw = st.get(self.keys.verdict)
        if raw is not None:
            try:
                verdict = decode_verdict(raw)
            except RendezvousError as e:
                log.warning(f"{e}; ignored")
        self._seen_closed = RendezvousClosedError(
            f"the job was closed: {printable(reason)}",
            verdict,
            succeeded=reason.startswith(FINISHED.encode()),
        )
        try:
            self._ack(st)
        except Exception:  # the host may be gone already: it waits for nobody then
            log.debug("telling the store host the verdict was read failed", exc_info=True)
        return self._seen_closed
