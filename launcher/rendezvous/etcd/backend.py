"""`EtcdRendezvous`: the protocol on an etcd cluster, each agent signed in on a lease of its own."""

from __future__ import annotations

import json
import logging

from ...net import free_port
from ..api import JobParams, LastWill
from ..protocol import ElasticRendezvous
from ..records import Node
from .lease import Lease, lease_ttl
from .settings import EtcdSettings
from .store import EtcdStore

log = logging.getLogger(__name__)


class EtcdRendezvous(ElasticRendezvous):
    """ElasticRendezvous on an etcd cluster: the agent signs in under the run id on its own lease."""

    def __init__(self, settings: EtcdSettings, job: JobParams):
        s = settings.rdzv
        opts = settings.cluster  # the workers never get the password: see env.AGENT_ONLY
        ttl = lease_ttl(s)
        lease = Lease(opts, ttl, min(s.keep_alive_interval, ttl / 3))
        store = EtcdStore(opts, lease, retry_for=s.read_timeout)
        node = Node.of_this_agent(job, opts.endpoints[0])
        try:
            store.register(job.run_id, node.node_id, retry_for=s.join_timeout)
        except BaseException:
            lease.close()
            store.close()
            raise
        super().__init__(
            store,
            job.run_id,
            node,
            s,
            port_picker=free_port,
        )

    def last_will(self) -> LastWill | None:
        """What this agent's guard sends etcd if the agent dies: its lease revoked (every key on it gone)
        at once, not at the end of its TTL. Plain HTTP without a user only (a TLS session or a login
        token cannot be prepared ahead): there the TTL tells, as after a lease renewal (a new id)."""
        opts = self.store.lease.opts
        if opts.tls or opts.user or not self.store.lease.id:
            return None
        host, port = opts.endpoints[0]
        body = json.dumps({"ID": str(self.store.lease.id)}, separators=(",", ":")).encode()
        head = (
            f"POST /v3/lease/revoke HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        return LastWill(host, port, head.encode() + body)

    def shutdown(self, succeeded: bool, why: str = "") -> None:
        """Leave the round, give the lease back; the last agent out deletes the run's keys."""
        self._stop_watch.set()
        self.store.lease.wake()  # the watcher leaves now, not at the end of its wait
        super().shutdown(succeeded, why)
        try:
            self.store.leave(self.run_id)
        except Exception:  # the lease expires on its own; the next run wipes what is left
            log.debug("leaving the etcd rendezvous failed", exc_info=True)
        finally:
            self.store.close()
