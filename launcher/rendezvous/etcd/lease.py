"""This agent's etcd lease.

Liveness: each agent holds one lease (TTL = the liveness timeout, at least etcd's 2 s floor),
refreshed by a thread that rides out etcd restarts and leader changes (leases survive both) and
takes a new lease, with its keys, if the old one expired anyway. Once the refreshes have failed for
read_timeout the agent gives its round up (a watch on a cut connection stays silent: a node cut off
from etcd would otherwise run its workers on in a round the others left long ago). The agent's registration
`agents/<node>` and its alive keys live on that lease: a dead agent's keys vanish and its
neighbour's watch sees the DELETE. Clean-up: the last agent out deletes the run's keys; the first
agent of a new run, finding no agent registered, wipes whatever a killed run left behind.

"""

from __future__ import annotations

import logging
import math
import threading
import time

from ...errors import RendezvousConnectionError, RendezvousError
from ..settings import RendezvousSettings
from .engine import EtcdError, Put, Watch
from .settings import EtcdOptions
from .store import EtcdStore, LeaseLost

log = logging.getLogger(__name__)
MIN_TTL = 2  # etcd raises shorter leases to 1.5 election timeouts: 2 s at its defaults


def lease_ttl(settings: RendezvousSettings) -> int:
    """Whole seconds (etcd's unit), never below what etcd grants."""
    return max(MIN_TTL, math.ceil(settings.liveness_timeout))


class Lease:
    """This agent's lease and the keys on it, refreshed by a thread with a client of its own."""

    def __init__(self, opts: EtcdOptions, ttl: int, interval: float):
        self.opts, self.ttl, self.interval = opts, ttl, interval
        self.store: EtcdStore | None = None  # made by start, beside the agent's client
        self.id = 0
        self.held: dict[bytes, bytes] = {}
        self.waiting: set[Watch] = set()  # the watches of this agent's open waits
        self.lost_at: float | None = None  # when the refreshes began to fail (None while etcd answers them)
        self.why = ""  # why the last one failed
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, via: EtcdStore, retry_for: float) -> None:
        """Grant the lease (through `via`, which retries up to `retry_for`) and start refreshing it."""
        # Short request timeout: a hung member must not outlast the TTL before we fail over.
        self.store = EtcdStore(
            self.opts, retry_for=self.ttl, client=via.client.sibling(max(1.0, self.ttl / 2)), owns_client=True
        )
        self.id = via._call(lambda e: e.lease_grant(self.ttl), retry_for=retry_for)
        self._thread = threading.Thread(target=self._run, name="launcher-etcd-lease", daemon=True)
        self._thread.start()

    def hold(
        self,
        name: bytes,
        value: bytes,
        via: EtcdStore,
        retry_for: float | None = None,
        sweep: tuple[list, list, list] | None = None,
    ) -> None:
        """Put `name` on the lease (taking a new lease first if etcd forgot this one); kept across renewals.
        With `sweep` (a txn's compares and ops), the put runs in that txn, whatever its compares say."""
        compare, success, failure = sweep or ([], [], [])
        for attempt in range(2):
            lease_id = self.id
            put = Put(name, value, lease_id)
            try:
                if sweep is None:
                    via._call(lambda e, lease=lease_id: e.put(name, value, lease=lease), retry_for=retry_for)
                else:
                    via._call(lambda e, p=put: e.txn(compare, [*success, p], [*failure, p]), retry_for=retry_for)
                break
            except LeaseLost:
                if attempt:
                    raise RendezvousConnectionError("etcd keeps losing this agent's lease") from None
                self._renew(lease_id)
        self.held[name] = value

    def failing(self) -> tuple[float, str]:
        """(for how many seconds the refreshes have failed, why) while they fail; else (0, "")."""
        lost_at, why = self.lost_at, self.why
        return (time.monotonic() - lost_at, why) if lost_at is not None else (0.0, "")

    def wake(self) -> None:
        """Make every wait of this agent return now (as at its timeout)."""
        for watch in list(self.waiting):
            watch.wake()

    def revoke(self, via: EtcdStore) -> None:
        """Stop refreshing and give the lease back: every key on it vanishes at once."""
        self.close()
        try:
            via._call(lambda e: e.lease_revoke(self.id), retry_for=2.0)
        except (RendezvousError, LeaseLost):  # it expires on its own
            log.debug("revoking the etcd lease failed", exc_info=True)

    def close(self) -> None:
        """Stop refreshing; the lease then expires within its TTL."""
        self._stop.set()
        if self._thread:
            self._thread.join(self.store.client.timeout + 1.0)
        if self.store is not None:
            self.store.close()

    def _run(self) -> None:
        told = False
        while not self._stop.wait(self.interval if self.lost_at is None else min(self.interval, 0.2)):
            try:
                ttl = self._refresh()
            except Exception as e:
                log.debug("etcd lease keep-alive failed", exc_info=True)
                self.why = (e.why if isinstance(e, EtcdError) else f"{type(e).__name__}: {e}") or "no answer"
                self.lost_at = self.lost_at or time.monotonic()
                if not told and time.monotonic() - self.lost_at >= 1.0:
                    told = True
                    log.info(f"lost etcd at {self.opts.where} ({self.why}); the workers go on, retrying")
                continue
            if told:
                log.info(f"etcd is back after {time.monotonic() - (self.lost_at or 0):.1f} s")
            self.lost_at, told = None, False
            if ttl <= 0:
                log.info("etcd let this agent's lease expire; taking a new one")
                try:
                    self._renew(self.id)
                except Exception:  # the next round of the loop tries again
                    log.debug("taking a new etcd lease failed", exc_info=True)

    def _refresh(self) -> int:
        self.store.rpcs += 1
        return self.store.client.get().lease_keepalive(self.id)

    def _renew(self, stale: int) -> None:
        """A new lease with every held key on it (once, whichever thread notices first)."""
        with self._lock:
            if self.id != stale:
                return
            new = self.store._call(lambda e: e.lease_grant(self.ttl))
            for name, value in list(self.held.items()):
                self.store._call(lambda e, n=name, v=value: e.put(n, v, lease=new))
            self.id = new
