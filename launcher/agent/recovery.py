"""--recovery in-place, the agent's side (docs/in-place.md): a failed worker is replaced alone.

The supervisor calls `recover` where it would stop the group for a failed worker of this node,
`follow` where another node's failure or loss would stop it, and `on` with what the threads below
post; what this module reads and drives of the supervisor is `Host`. Recovering in place, every
agent of the job
1. asks the rendezvous for the next round on a thread, its workers running meanwhile: the node of
   the failure charges it to the job-wide budget (the others join as for a membership change);
   group rank 0's agent offers the port of the bootstrap store it keeps serving, so the round keeps
   that store, to which every survivor is connected, and a spare's workers meet them there;
2. opens the round in that store (`inplace.keys`): each survivor's watcher wakes (and aborts a
   NCCL collective that would block); gloo's collectives raised already, when the lost peer's
   sockets closed; either way the survivors recover at the end of the step in flight;
3. starts this node's replacements alone, with the new round's environment (forked with --preload);
   a worker of this node lost meanwhile, before it entered that round, is replaced in it too;
4. waits on a thread until every rank joined the round holding the state; when that does not
   happen within --in_place_timeout it stops the group and restarts it, and says so.
It declines (the group restarts as with --recovery restart) when no restart is left, when a worker
fails in the round under way (after entering it) or the membership changes during a recovery, when the
round's store is not the launcher's, and when the next round cannot keep it (the node serving it was
lost) or the world changed. A worker that says it cannot go on in place (`keys.LEAVE_EXIT`) while a
recovery is under way restarts the group free of charge: it is collateral of the fault charged.
A node that learns so once in the round (another node restarts its workers there) restarts its own
in that round, heartbeating it through the stop, rather than ask for one more. A worker lost after
every rank finished the job (`keys.finished`) costs nothing: nothing runs again.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from ..config import LaunchConfig
from ..errors import RendezvousError
from ..rendezvous.api import Cause, MembershipChanged, RendezvousHandler, offer_port
from ..spec import Failure, RecoveryMode, Round, Verdict, WorkerState
from ..tcpstore.client import StoreClient, StoreError
from ..worker.inplace import keys
from .bootstrap import BootstrapStore
from .loop_events import Then
from .members import Member

log = logging.getLogger(__name__)
ONE_NODE_NOTICE = 5.0  # seconds a worker waits for the agent's word after a peer's error (deaths seen at once)
NODES_NOTICE = 20.0  # ... across nodes: the store's session grace or lease, then the round's rendezvous
TOGETHER = 1.0  # seconds: failures this close to the first are one fault (a node's GPUs, the OOM killer), one charge;
# seen by the agent, whose look at exits a busy host delays: deaths 40-70 ms apart were seen 0.1-0.3 s apart
END_WAIT = 1.0  # seconds the group's end waits for a pending round's wait to return (it has, as a rule)


class Host(Protocol):
    """What an in-place recovery reads of its supervisor and the verbs it drives there (`Supervisor` is one)."""

    rendezvous: RendezvousHandler  # asked for the next round, offered the port of the store kept
    bootstrap: BootstrapStore  # the workers' store this node serves (as group rank 0), kept across rounds
    round: Round | None  # the round this node's workers run in: a recovery moves it on
    members: list[Member]  # this node's workers: a recovery drops those it replaces
    failures: list[Failure]  # every failed exit seen, in order
    held: tuple[Round, float] | None  # a round joined, its workers started once the stop is complete
    clock: Callable[[], float]  # the supervisor's clock

    def post(self, event: object) -> None:
        """Hand an event to the supervisor's loop (from any thread)."""

    def emit(self, kind: str, **fields: object) -> None:
        """One event to the events file and the other sinks."""

    def root_verdict(self) -> Verdict | None:
        """This node's root cause, as the rendezvous publishes it should it close the job."""

    def watch_round(self, rnd: Round) -> None:
        """Heartbeat round `rnd` and watch it from now on."""

    def start_ranks(self, rnd: Round, ranks: Collection[int]) -> bool:
        """Start this node's workers of round `rnd` whose rank is in `ranks`; False: one could not."""

    def announce_running(self, rnd: Round, **extra: object) -> None:
        """The `running` event of round `rnd`."""

    def stop_workers(self, signum: int, grace: float, then: Then, reason: str | None = None) -> None:
        """Stop every live worker (SIGKILL after `grace` s); `then` follows once they are all gone."""


@dataclass(frozen=True)
class Recovered:
    """The end of an in-place round's wait: every rank joined it (`ok`), or the bound passed."""

    round: int
    ok: bool
    at: float  # when it ended, on the supervisor's clock
    lost: str = ""  # why the wait ended early: the round's store went away (else the bound passed)


@dataclass(frozen=True)
class Joined:
    """The round an in-place recovery asked the rendezvous for, or why none came."""

    rnd: Round | None
    error: RendezvousError | None = None


@dataclass
class Joining:
    """An in-place recovery asking for its round (the workers of this node still running)."""

    began: float  # when the failure was seen (or heard of), on the supervisor's clock
    ranks: list[int] = field(default_factory=list)  # this node's ranks to replace
    pids: set[int] = field(default_factory=set)  # the workers they replace (dropped from the members then)
    failed: str = ""  # what failed here ("" when another node's failure or loss is followed)
    leave: str = ""  # a worker here cannot go on in place (why): this node restarts its workers in the round
    carried: tuple[int, ...] = ()  # ranks an earlier round of this recovery replaced, their replacements running
    carried_pids: frozenset[int] = frozenset()  # ... those replacements


@dataclass
class Pending:
    """An in-place recovery under way."""

    round: int
    began: float  # when the failure was seen, on the supervisor's clock
    ranks: tuple[int, ...]  # the ranks replaced
    pids: set[int] = field(default_factory=set)  # their replacements, started for this round


def in_place(host: Host, config: LaunchConfig, environ: dict[str, str]) -> InPlace | None:
    """`host`'s in-place recoveries, where `config` asks for them (--recovery in-place); `environ`: the workers'."""
    return InPlace(host, config, environ) if config.recovery is RecoveryMode.IN_PLACE else None


class InPlace:
    """The in-place recoveries of one agent (`sup`: its supervisor, whose verbs this drives)."""

    def __init__(self, sup: Host, config: LaunchConfig, environ: dict[str, str]):
        self.sup, self.config, self.timeout = sup, config, config.in_place_timeout
        self.joining: Joining | None = None
        self.pending: Pending | None = None
        self.ended: float | None = None  # when the last recovery ended, on the supervisor's clock
        self._waiter: threading.Thread | None = None  # the pending round's wait (`_wait`)
        self._heard: Recovered | None = None  # what it last ended with
        self.folder = environ.get(keys.SLOTS_VAR, "")  # the workers' memory folder (agent/slots.py)
        environ[keys.RECOVERY_VAR] = keys.IN_PLACE  # the workers' launcher.worker.inplace.Job reads them
        # A node lost whole (no last will) is known once the rendezvous store ends its session (5 s on
        # c10d) or its lease: the survivors' error must wait that long, and the round's forming, for the word.
        environ.setdefault(keys.NOTICE_VAR, str(NODES_NOTICE if config.multi_node else ONE_NODE_NOTICE))

    def silence(self, idle: float, now: float) -> float | None:
        """A worker's silence as --hang_timeout counts it: none while a recovery is under way (the survivors
        wait on it, bounded by --in_place_timeout), and none from before the last recovery ended."""
        if self.joining is not None or self.pending is not None:
            return None
        return idle if self.ended is None else min(idle, now - self.ended)

    def _waiting_with(self, failed: list[Member]) -> bool:
        """Another running rank of this node has been silent for half --hang_timeout or more: blocked, as a
        rule, in the collective the hung one never joined. On a busy host the last words of the ranks that
        wait on a hung one differ by a step or more, and the judge may see one of them past the timeout
        a look before the others (a waiting rank replaced, the hung one left in the group)."""
        sup, now = self.sup, self.sup.clock()
        half = self.config.hang_timeout / 2
        return any(
            m.state is WorkerState.RUNNING and m not in failed and sup.awake.silence(m.idle(now), now) >= half
            for m in sup.members
        )

    def recover(self, failed: list[Member]) -> str | None:
        """What the `failed` workers of this node cost. None: the group runs on (they are replaced in place,
        or were lost after the job's end) or this node restarts it free of charge (a worker could not go on
        in place, `_leave`); else the group restarts, charged, and this is the line that says why ("": none)."""
        sup, rnd, pending = self.sup, self.sup.round, self.pending
        pids = {m.proc.pid for m in failed}
        ranks = sorted(m.worker.rank for m in failed)
        seen = [f for f in sup.failures if f.pid in pids]
        named = ", ".join(f"rank {f.worker.rank} {f.reason or f.exit.describe()}" for f in seen)
        left = sorted(f.worker.rank for f in seen if f.exit.returncode == keys.LEAVE_EXIT)
        under = self.joining is not None or pending is not None  # a recovery of this node
        asked = [keys.finished(rnd.round)] if rnd is not None else []
        if pending is not None:
            asked += [keys.entering(pending.round, r) for r in ranks]
        elif left and not under and rnd is not None:  # another node's recovery opened the next round
            asked.append(keys.opened(rnd.round + 1))
        held = _holds(rnd, asked)
        if rnd is not None and (keys.finished(rnd.round) in held or self._finished_here(rnd.round)):
            return self._after_end(failed, seen)
        if left and (under or (rnd is not None and keys.opened(rnd.round + 1) in held)):
            return self._leave(failed, left)
        for m in failed:  # replaced, not failed, from now on (and not counted among the members that finished)
            m.state = WorkerState.STOPPED
        if self.joining is not None:  # the next round is on its way: these are replaced in it too
            # (also ranks judged hung now, waiting on the rank that round replaces: declining here
            # would charge the one fault twice and ask for a round while that one is asked for)
            self.joining.ranks.extend(ranks)
            self.joining.pids.update(pids)
            return None
        if pending is not None:
            stuck = all(f.exit.returncode == keys.REJOIN_EXIT for f in seen)  # collateral of the loss it waited on
            return self._during(failed, named, [r for r in ranks if keys.entering(pending.round, r) in held], stuck)
        if any(m.hung for m in failed) and (sum(m.hung for m in sup.members) > 1 or self._waiting_with(failed)):
            for m in failed:
                m.state = WorkerState.FAILED
            # The ranks blocked in a collective on a hung one are as silent as it, and the hang clock
            # judges them in the same look: replacing them would leave nobody holding the state.
            return self._refuse(named, "several ranks went silent at once (a hang, and the ranks waiting on it)")
        why = self._declined(rnd)
        if why or rnd is None or rnd.restart_count >= self.config.max_restarts:  # spent: stop, as with restart
            for m in failed:
                m.state = WorkerState.FAILED
            return self._refuse(named, why) if why else ""
        began = min((f.at for f in seen), default=sup.clock())  # when it was seen
        self._ask(Joining(began, ranks, pids, named), Cause.FAILURE, sup.root_verdict())
        return None

    def follow(self, event: MembershipChanged) -> bool:
        """Another node's worker failed, or a node was lost: join the next round in place; False: restart."""
        if event.closed:
            return False
        if self.joining is not None:
            return True  # the round this recovery leaves ended: heard already
        joining = Joining(self.sup.clock())
        if self.pending is not None:  # the round under recovery ended too (another node's second fault):
            # its recovery goes on in the round after, this node's replacements running on into it
            p, self.pending = self.pending, None
            joining = Joining(p.began, carried=p.ranks, carried_pids=frozenset(p.pids))
        why = self._declined(self.sup.round) or _unreachable(self.sup.round)
        if why:
            return self._decline(why)
        what = "a worker failed on another node: " if event.failed else "membership changed: "
        log.info(f"{what}{event.reason}; recovering in place: the workers of this node keep running")
        self.sup.emit("membership", reason=event.reason, in_place=True)
        self._ask(joining, Cause.MEMBERSHIP, None)
        return True

    def owns(self, event: object) -> bool:
        """Whether `event` is one of this recovery's own (handed to `on`)."""
        return isinstance(event, (Joined, Recovered))

    def on(self, event: Joined | Recovered) -> None:
        """What a thread of this recovery posted to the supervisor's loop."""
        if isinstance(event, Joined):
            self._joined(event)
        else:
            self._settle(event)

    # ------------------------------------------------------------------ inside

    def _ask(self, joining: Joining, cause: Cause, verdict: Verdict | None) -> None:
        """Ask the rendezvous for the next round on a thread; the answer comes as `Joined`."""
        sup, self.joining = self.sup, joining
        server = sup.bootstrap.server
        offer_port(sup.rendezvous, server.port if server is not None else 0)  # the round keeps this store

        def ask() -> None:
            try:
                sup.post(Joined(sup.rendezvous.next_round(cause, verdict)))
            except RendezvousError as e:
                sup.post(Joined(None, e))
            except Exception as e:  # a backend bug must end in a restart with a message, never hang the job
                log.debug("the in-place round's rendezvous failed", exc_info=True)
                sup.post(Joined(None, RendezvousError(f"rendezvous failed unexpectedly: {type(e).__name__}: {e}")))

        threading.Thread(target=ask, name="launcher-inplace-round", daemon=True).start()

    def _joined(self, event: Joined) -> None:
        """The next round came: open it in the kept store and start this node's replacements."""
        sup, joining, old = self.sup, self.joining, self.sup.round
        self.joining = None
        if joining is None or old is None:
            return
        if event.rnd is None:
            log.info(f"no in-place recovery: {event.error}; restarting the group")
            return self._restart(Then.RESTART if joining.failed else Then.MEMBERSHIP)
        new = event.rnd
        why = _misfit(old, new)
        if why:
            self._decline(why)
            return self._restart(Then.MEMBERSHIP)  # this round is taken: the next one re-forms the group
        if new.group_world_size > 1 and (new.master_addr, new.master_port) != (old.master_addr, old.master_port):
            # group rank 0 restarted its workers in it (or a spare took its seat): they are in its new store
            self._decline(
                "the node serving the workers' store (group rank 0) was lost or restarted the group: "
                f"round {new.round} has a new store"
            )
            return self._restart_in(new)
        new = replace(new, master_addr=old.master_addr, master_port=old.master_port, use_agent_store=True)
        if joining.leave:  # a worker here cannot go on in place: restart them all in this round, charged once
            self._decline(joining.leave, say=False)
            return self._restart_in(new)
        try:
            client = StoreClient(old.master_addr, old.master_port, timeout=10.0)
            if client.check([keys.declined(old.round)]):  # a node restarts its workers: they will not come
                why = client.get(keys.declined(old.round), False).decode(errors="replace")
                client.close()
                self._decline(f"another node restarts the group ({why})")
                return self._restart_in(new)
            client.set(keys.NEWEST, str(new.round).encode())  # every node sets it: the first wakes the survivors
            client.set(keys.opened(new.round), b"1")  # the survivors' wake-up
        except (OSError, StoreError) as e:
            log.warning(f"no in-place recovery: the round's store did not answer ({e}); restarting the group")
            return self._restart_in(new)  # its node lost: the round's watch ends it, and a new one forms
        ranks = tuple(sorted(joining.ranks))
        used = f"{new.restart_count} of {self.config.max_restarts} restarts used"
        if ranks:
            who = f"{joining.failed}; " if joining.failed else ""
            log.info(
                f"{who}recovering in place: round {new.round} ({used}), starting rank {', '.join(map(str, ranks))}; "
                "the other ranks keep running"
            )
        else:
            log.info(f"recovering in place: round {new.round} ({used}); the workers of this node keep running")
        sup.emit("rendezvous", cause="in_place")
        sup.round, sup.members = new, [m for m in sup.members if m.proc.pid not in joining.pids]
        sup.watch_round(new)  # heartbeat and watch the new round (the last one's watch ended with it)
        if not sup.start_ranks(new, ranks):
            client.close()
            return  # it could not start: the supervisor is ending the job
        sup.announce_running(new, in_place=True)
        started = {m.proc.pid for m in sup.members if m.worker.rank in ranks} | joining.carried_pids
        self.pending = Pending(new.round, joining.began, tuple(sorted({*ranks, *joining.carried})), started)
        self._waiter = threading.Thread(
            target=self._wait, args=(client, new.round), name="launcher-inplace", daemon=True
        )
        self._waiter.start()

    def at_end(self) -> None:
        """The group succeeded with a recovery pending: its ranks stepped again and finished before this loop
        heard the round's wait end (the workers' exits came first), so it ends now, said as any other."""
        pending, waiter = self.pending, self._waiter
        if pending is None:
            return
        if waiter is not None:
            # Its wait ends as the last rank sets `ready`, which every rank did before it finished.
            waiter.join(END_WAIT)
        heard = self._heard
        if heard is None or heard.round != pending.round or not heard.ok:
            heard = Recovered(pending.round, True, self.sup.clock())
        self._settle(heard)

    def _settle(self, event: Recovered) -> None:
        """The round's wait ended: say how long the job lost, or fall back to restarting the group."""
        sup, pending = self.sup, self.pending
        if pending is None or pending.round != event.round:
            return
        self.pending, self.ended = None, event.at
        took = self.ended - pending.began
        if event.ok:
            log.info(f"round {pending.round}: every rank is stepping again, {took:.2f} s after the failure (in place)")
            sup.emit("recovered", round=pending.round, ranks=list(pending.ranks), seconds=round(took, 3))
            return
        if event.lost:  # the node serving the round's store was lost (or restarted) under the wait
            self._decline(event.lost)
            return self._restart(Then.MEMBERSHIP)  # its restart is charged already, as below
        log.warning(
            f"the in-place recovery of round {pending.round} did not finish within {self.timeout:g} s "
            "(--in_place_timeout); restarting the group"
        )
        sup.emit("in_place_failed", round=pending.round, seconds=round(took, 3))
        # Its restart is charged already: the new round is asked for as a membership change.
        self._restart(Then.MEMBERSHIP)

    def _finished_here(self, rnd: int) -> bool:
        """A worker of this node saw every rank finish the job in round `rnd` (the store may be gone since:
        group rank 0's node exits once its own workers are done)."""
        return bool(self.folder) and os.path.exists(keys.finished_file(self.folder, rnd))

    def _after_end(self, failed: list[Member], seen: list[Failure]) -> None:
        """Workers lost after every rank finished the job (the round's `finished` key): done, not failed."""
        pids = {m.proc.pid for m in failed}
        for m in failed:
            m.state = WorkerState.SUCCEEDED  # the job it ran is over: nothing to recover, nothing to restart
        self.sup.failures[:] = [f for f in self.sup.failures if f.pid not in pids]
        for f in seen:
            how = f.reason or f.exit.describe()
            log.info(f"rank {f.worker.rank} {how} after every rank finished the job; nothing runs again")
            self.sup.emit("lost_after_end", rank=f.worker.rank, pid=f.pid, round=f.round, how=how)

    def _leave(self, failed: list[Member], left: list[int]) -> None:
        """Workers that cannot go on in place (`keys.LEAVE_EXIT`) while a recovery is under way: collateral of
        the fault charged already, so the group restarts free of charge."""
        rnd, joining, pending = self.sup.round, self.joining, self.pending
        for m in failed:
            m.state = WorkerState.STOPPED
        nxt = rnd.round + 1 if rnd is not None else 0
        if pending is not None:
            under = f"round {pending.round} recovers"
        elif joining is not None:
            under = f"round {nxt} is asked for"
        else:
            under = f"another node recovers round {nxt}"
        why = f"{_ranks(left)} cannot go on in place (exit {keys.LEAVE_EXIT}) while {under} in place"
        log.info(f"{why}: restarting the group, charging no more restarts (the fault was charged)")
        if joining is not None:  # this node restarts its workers in the round asked for, once it comes
            joining.leave = joining.leave or why
            joining.pids.update(m.proc.pid for m in failed)
            return
        self.pending = None  # the group restarts: that recovery's wait ends unheard
        self._decline(why, say=False)
        self._restart(Then.MEMBERSHIP)

    def _during(self, failed: list[Member], named: str, entered: list[int], stuck: bool = False) -> str | None:
        """Workers of this node failed while round `pending.round` recovers in place. One that left nothing of
        itself there (it had not entered the round, and is no replacement started for it) takes its seat in
        that round too, free of charge. Else the recovery goes on in the round after, where every rank meets
        again (the ranks joining `pending.round` wait for the lost one): free of charge within TOGETHER s of
        the first failure (one fault), else charged once more; with no restart left, the group stops."""
        sup, pending = self.sup, self.pending
        assert pending is not None
        ranks = sorted(m.worker.rank for m in failed)
        pids = {m.proc.pid for m in failed}
        started = sorted(m.worker.rank for m in failed if m.proc.pid in pending.pids)
        if not entered and not started and sup.round is not None and sup.round.round == pending.round:
            sup.members = [m for m in sup.members if m.proc.pid not in pids]
            log.info(
                f"{named} before entering round {pending.round}, which is recovering in place: starting "
                f"{_ranks(ranks)} in that round too (no restart charged)"
            )
            if sup.start_ranks(sup.round, ranks):  # else it could not start: the supervisor ends the job
                pending.ranks = tuple(sorted((*pending.ranks, *ranks)))
                pending.pids.update(m.proc.pid for m in sup.members if m.worker.rank in ranks)
            return None
        detail = f"after {_ranks(entered)} entered it" if entered else f"{_ranks(started)} was started for it"
        at = min((f.at for f in sup.failures if f.pid in pids), default=sup.clock())
        together = stuck or at - pending.began <= TOGETHER
        rnd = sup.round
        if together or (rnd is not None and rnd.restart_count < self.config.max_restarts):
            self.pending = None  # its wait ends unheard: the round after replaces it
            cost = f"within {TOGETHER:g} s of the first failure: no restart charged" if together else "one more restart"
            cost = "stuck joining on a rank lost since: no restart charged" if stuck else cost
            log.info(
                f"{named} while round {pending.round} was recovering in place ({detail}): "
                f"recovering in place in the round after it ({cost})"
            )
            carried = tuple(r for r in pending.ranks if r not in ranks)
            kept = frozenset(m.proc.pid for m in sup.members if m.proc.pid in pending.pids and m.proc.pid not in pids)
            self._ask(
                Joining(pending.began, ranks, pids, named, carried=carried, carried_pids=kept),
                Cause.MEMBERSHIP if together else Cause.FAILURE,
                None if together else sup.root_verdict(),
            )
            return None
        for m in failed:
            m.state = WorkerState.FAILED
        self.pending = None  # the group stops: that recovery's wait ends unheard
        self._decline(f"a worker failed while round {pending.round} was recovering in place ({detail})", say=False)
        return f"{named} while round {pending.round} was recovering in place ({detail}): {self._then()}"

    def _refuse(self, named: str, why: str) -> str:
        """Decline for the `named` failures: the line that says why, and what the group's restart costs."""
        self._decline(why, say=False)
        return f"{named}; no in-place recovery: {why}; {self._then()}"

    def _then(self) -> str:
        """What a charged restart of the group comes to: one more restart, or the end of the job."""
        rnd, cap = self.sup.round, self.config.max_restarts
        if rnd is not None and rnd.restart_count >= cap:
            return f"no restart left (--max_restarts {cap}): stopping the group"
        return "restarting the group (one more restart)"

    def _restart(self, then: Then) -> None:
        """Stop this node's workers; the round after comes from the rendezvous with a fresh store."""
        offer_port(self.sup.rendezvous, 0)
        self.sup.stop_workers(signal.SIGTERM, self.config.shutdown_timeout, then=then, reason="restart")

    def _restart_in(self, new: Round) -> None:
        """Restart this node's workers in round `new`, which it has joined: another node starts its own there.
        Asking for a round more would cost the job a second restart, and the stop (up to --shutdown_timeout
        for a worker that ignores SIGTERM) would not heartbeat `new`: the others would take it for lost."""
        self.sup.watch_round(new)
        self.sup.held = (new, self.sup.clock())  # started once the stop is complete (`Supervisor.check_stop`)
        self._restart(Then.MEMBERSHIP)

    def _decline(self, why: str, say: bool = True) -> bool:
        """Tell the events file and the other nodes (the round's store) why the group restarts; `say`: log it."""
        if say:
            log.info(f"no in-place recovery: {why}; restarting the group")
        self.sup.emit("in_place_declined", reason=why)
        offer_port(self.sup.rendezvous, 0)
        rnd = self.sup.round
        if rnd is not None and rnd.use_agent_store and rnd.group_world_size > 1:  # the other nodes follow
            try:
                client = StoreClient(rnd.master_addr, rnd.master_port, timeout=2.0, connect_timeout=0.5)
                client.set(keys.declined(rnd.round), why.encode())
                client.close()
            except (OSError, StoreError):  # its store is gone: the others cannot recover in place either
                log.debug("could not tell round %d's store of the decline", rnd.round, exc_info=True)
        return False

    def _declined(self, rnd: Round | None) -> str:
        """Why this failure cannot be recovered in place ("" if it can)."""
        if rnd is None:
            return "no round is running"
        if self.pending is not None:
            stale, self.pending = self.pending, None  # the group restarts: that recovery's wait ends unheard
            return f"a worker failed or a node was lost while round {stale.round} was recovering in place"
        if not rnd.use_agent_store or (rnd.group_rank == 0 and self.sup.bootstrap.server is None):
            return "the launcher does not serve the round's store"
        if rnd.group_world_size > 1 and self.sup.rendezvous.shared_store() is None:
            return "the nodes share no rendezvous store (--rdzv_backend static)"
        return ""

    def _wait(self, client: StoreClient, rnd: int) -> None:
        lost = ""
        try:
            ok = client.wait([keys.ready(rnd)], timeout=self.timeout)
        except (OSError, StoreError) as e:  # the store closed under the wait: its node was lost or restarted
            log.debug("the wait for in-place round %d ended with the store", rnd, exc_info=True)
            ok, lost = False, _store_gone(e)
        finally:
            client.close()
        self._heard = Recovered(rnd, ok, self.sup.clock(), lost)
        self.sup.post(self._heard)


def _unreachable(rnd: Round) -> str:
    """Why round `rnd`'s workers cannot follow another node in place ("" if they can): its store must answer.
    (Workers still starting follow too: one that reaches `Job()` after the next round opened joins that one.)"""
    try:
        client = StoreClient(rnd.master_addr, rnd.master_port, timeout=5.0, connect_timeout=1.0)
    except (OSError, StoreError) as e:
        return _store_gone(e)
    try:
        client.check([keys.NEWEST])
    except (OSError, StoreError) as e:
        return _store_gone(e)
    finally:
        client.close()
    return ""


def _store_gone(e: Exception) -> str:
    return (
        f"the workers' store did not answer ({e}): the node serving it (group rank 0) was lost or restarted the group"
    )


def _misfit(old: Round, new: Round) -> str:
    """Why round `new` cannot keep `old`'s workers in place: their seats changed ("" if they did not)."""
    if (new.world_size, new.group_world_size) != (old.world_size, old.group_world_size):
        return f"the next round's world differs (world size {old.world_size} -> {new.world_size})"
    if (new.group_rank, new.rank_offset) != (old.group_rank, old.rank_offset):
        return f"this node's ranks moved (group rank {old.group_rank} -> {new.group_rank})"
    return ""


def _holds(rnd: Round | None, names: Sequence[str]) -> set[str]:
    """Which keys of `names` round `rnd`'s store holds (none where it does not answer: its node was lost)."""
    if rnd is None or not rnd.use_agent_store or not names:
        return set()
    try:
        client = StoreClient(rnd.master_addr, rnd.master_port, timeout=2.0, connect_timeout=0.5)
    except (OSError, StoreError):
        log.debug("round %d's store did not answer", rnd.round, exc_info=True)
        return set()
    try:
        return {name for name in names if client.check([name])}
    except (OSError, StoreError):
        log.debug("round %d's store did not answer", rnd.round, exc_info=True)
        return set()
    finally:
        client.close()


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
