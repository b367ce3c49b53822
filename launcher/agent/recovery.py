"""--recovery in-place, the agent's side (docs/in-place.md): a failed worker is replaced alone.

The supervisor calls `recover` where it would stop the group for a failed worker, and `settle`
with the answer to the wait `recover` starts. Recovering in place, the agent
1. charges the failure to the restart budget: the next round comes from the rendezvous as for a
   restart, but keeps this round's bootstrap store, to which the survivors are connected;
2. opens the round in that store (`inplace.keys`): each survivor's watcher wakes (and aborts a
   NCCL collective that would block); gloo's collectives raised already, when the lost peer's
   sockets closed; either way the survivors recover at the end of the step in flight;
3. starts the replacement alone, with the new round's environment (forked with --preload);
4. waits on a thread until every rank joined the round holding the state; when that does not
   happen within --in_place_timeout it stops the group and restarts it, and says so.
It declines (the group restarts as with --recovery restart) when no restart is left, when a worker
fails while a recovery is under way, or when this agent does not serve the round's store.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass, replace
from typing import Any

from ..errors import RendezvousError
from ..rendezvous.api import Cause
from ..spec import RecoveryMode
from ..tcpstore.client import StoreClient, StoreError
from ..worker.inplace import keys
from .loop_events import Then
from .members import Member

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recovered:
    """The end of an in-place round's wait: every rank joined it (`ok`), or the bound passed."""

    round: int
    ok: bool


@dataclass(frozen=True)
class Pending:
    """An in-place recovery under way."""

    round: int
    began: float  # when the failure was seen, on the supervisor's clock
    ranks: tuple[int, ...]  # the ranks replaced


def in_place(sup: Any) -> InPlace | None:
    """The supervisor's in-place recoveries, where its config asks for them (--recovery in-place)."""
    return InPlace(sup, sup.config.in_place_timeout) if sup.config.recovery is RecoveryMode.IN_PLACE else None


class InPlace:
    """The supervisor's in-place recoveries (`sup`: the Supervisor, whose verbs this drives)."""

    def __init__(self, sup: Any, timeout: float):
        self.sup, self.timeout = sup, timeout
        self.pending: Pending | None = None
        sup.launching.environ[keys.RECOVERY_VAR] = keys.IN_PLACE  # the workers' launcher.worker.inplace.Job reads it

    def recover(self, failed: list[Member]) -> bool:
        """Replace the `failed` workers alone and keep the others running; False: restart the group."""
        sup, rnd = self.sup, self.sup.round
        why = self._declined(rnd)
        if why:
            log.info(f"no in-place recovery: {why}; restarting the group")
            sup.emit("in_place_declined", reason=why)
            return False
        if rnd.restart_count >= sup.config.max_restarts:
            return False  # the budget is spent: the group stops, as with --recovery restart
        try:
            new = sup.rendezvous.next_round(Cause.FAILURE, sup._verdict())
        except RendezvousError as e:
            log.info(f"no in-place recovery: {e}; restarting the group")
            return False
        new = replace(new, master_addr=rnd.master_addr, master_port=rnd.master_port, use_agent_store=True)
        try:
            client = StoreClient(rnd.master_addr, rnd.master_port, timeout=10.0)
            client.set(keys.NEWEST, str(new.round).encode())
            client.set(keys.opened(new.round), b"1")  # the survivors' wake-up
        except (OSError, StoreError) as e:
            log.warning(f"no in-place recovery: the round's store did not answer ({e}); restarting the group")
            return False
        pids = {m.proc.pid for m in failed}
        began = min((f.at for f in sup.failures if f.pid in pids), default=sup.clock())  # when it was seen
        ranks = tuple(sorted(m.worker.rank for m in failed))
        named = ", ".join(
            f"rank {f.worker.rank} {f.reason or f.exit.describe()}" for f in sup.failures if f.pid in pids
        )
        log.info(
            f"{named}; recovering in place: round {new.round} ({new.restart_count} of {sup.config.max_restarts} "
            f"restarts used), starting rank {', '.join(map(str, ranks))}; the other ranks keep running"
        )
        sup.emit("rendezvous", cause="in_place")
        sup.round, sup.members = new, [m for m in sup.members if m.proc.pid not in pids]
        workers, envs, plan = sup.prepare_round(new)
        for worker in workers:
            if worker.rank in ranks and not sup.start_member(worker, envs[worker.local_rank], plan, new.round):
                client.close()
                return True  # it could not start: the supervisor is ending the job
        sup.announce_running(new, in_place=True)
        self.pending = Pending(new.round, began, ranks)
        threading.Thread(target=self._wait, args=(client, new.round), name="launcher-inplace", daemon=True).start()
        return True

    def settle(self, event: Recovered) -> None:
        """The round's wait ended: say how long the job lost, or fall back to restarting the group."""
        sup, pending = self.sup, self.pending
        if pending is None or pending.round != event.round:
            return
        self.pending = None
        took = sup.clock() - pending.began
        if event.ok:
            log.info(f"round {pending.round}: every rank is stepping again, {took:.2f} s after the failure (in place)")
            sup.emit("recovered", round=pending.round, ranks=list(pending.ranks), seconds=round(took, 3))
            return
        log.warning(
            f"the in-place recovery of round {pending.round} did not finish within {self.timeout:g} s "
            "(--in_place_timeout); restarting the group"
        )
        sup.emit("in_place_failed", round=pending.round, seconds=round(took, 3))
        # Its restart is charged already: the new round is asked for as a membership change.
        sup.stop_workers(signal.SIGTERM, sup.config.shutdown_timeout, then=Then.MEMBERSHIP, reason="restart")

    def _declined(self, rnd) -> str:
        """Why this failure cannot be recovered in place ("" if it can)."""
        if rnd is None:
            return "no round is running"
        if self.pending is not None:
            stale, self.pending = self.pending, None  # the group restarts: that recovery's wait ends unheard
            return f"a worker failed while round {stale.round} was recovering in place"
        if rnd.group_world_size > 1:
            return "the job has several nodes"
        if self.sup.bootstrap.server is None:
            return "this launcher does not serve the round's store"
        return ""

    def _wait(self, client: StoreClient, rnd: int) -> None:
        try:
            ok = client.wait([keys.ready(rnd)], timeout=self.timeout)
        except (OSError, StoreError):  # the store closed under the wait: the group is stopping anyway
            log.debug("the wait for in-place round %d ended with the store", rnd, exc_info=True)
            ok = False
        finally:
            client.close()
        self.sup.post(Recovered(rnd, ok))
