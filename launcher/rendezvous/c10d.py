"""The c10d backend: the protocol on a TCPStore, spoken by our own pure-Python client and server.

`tcpstore.py` speaks torch's TCPStore wire protocol, so the agent never imports torch: a torch
TCPStore server can host the store, and torch clients can use ours. The store binds exactly the
address it was given (torch binds the wildcard). Who hosts: `--rdzv_conf is_host=` when given, else
the node whose own address is the endpoint's (checked by binding it, which is what counts).
`python -m launcher store` runs the store on its own, outside any training node.
"""

from __future__ import annotations

import resource
import signal
import threading
from typing import Callable, Sequence

from ..errors import RendezvousConnectionError
from ..net import free_port, is_local_address
from .api import JobParams
from .protocol import Capability, ElasticRendezvous, Node
from ..stragglers import Judge
from .settings import C10dSettings
from .tcpstore import StoreClient, StoreError, StoreServer

PREFIX = "launcher/"

# Beyond read_timeout, the longest a store may take to answer (a frozen store, a partitioned network
# or another program on the port would otherwise block an agent forever).
ANSWER_GRACE = 5.0


class TCPStoreAdapter:
    """The protocol's `Store` operations on one TCPStore client connection."""

    capabilities = frozenset({Capability.DELETE})

    def __init__(self, host: str, port: int, timeout: float, connect_timeout: float | None = None):
        self.host, self.port, self.timeout = host, port, timeout
        try:
            self.client = StoreClient(host, port, timeout + ANSWER_GRACE, connect_timeout or timeout)
        except StoreError as e:
            raise RendezvousConnectionError(f"cannot reach the rendezvous store at {host}:{port}: {e}") from None

    def _call(self, op: str, *args):
        try:
            return getattr(self.client, op)(*args)
        except StoreError as e:
            raise RendezvousConnectionError(f"rendezvous store at {self.host}:{self.port}: {e}") from None

    def add(self, key: str, amount: int) -> int:
        return self._call("add", PREFIX + key, amount)

    def get(self, key: str) -> bytes | None:
        k = PREFIX + key
        return self._call("get", k, False) if self._call("check", [k]) else None

    def set(self, key: str, value: bytes) -> None:
        self._call("set", PREFIX + key, value)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self._call("compare_set", PREFIX + key, expected, desired)

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        """True once every key exists; False when the store says `timeout` passed first."""
        return self._call("wait", [PREFIX + k for k in keys], timeout)

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return self._call("multi_get", [PREFIX + k for k in keys], False)  # the protocol waited for them

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        self._call("multi_set", [PREFIX + k for k in keys], list(values))

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._call("delete_key", PREFIX + key)

    def clone(self) -> "TCPStoreAdapter":
        return TCPStoreAdapter(self.host, self.port, self.timeout)

    def close(self) -> None:
        self.client.close()


def serve(host: str, port: int) -> StoreServer:
    """Start a TCPStore server (a thread of this process) bound to exactly `host:port`."""
    return StoreServer(host, port)


class C10dRendezvous(ElasticRendezvous):
    """ElasticRendezvous on a TCPStore, hosting the store here when this node is the endpoint."""

    def __init__(self, settings: C10dSettings, job: JobParams):
        host, port, s = settings.host, settings.port, settings.rdzv
        self.server = None
        wants_host = s.is_host if s.is_host is not None else is_local_address(host)
        if wants_host:
            try:
                self.server = serve(host, port)
            except OSError:
                if s.is_host:
                    raise RendezvousConnectionError(f"cannot host the rendezvous store on {host}:{port}: port taken") from None
                # another agent on this machine hosts it already: be a client
        store = TCPStoreAdapter(host, port, s.read_timeout, connect_timeout=s.join_timeout)
        super().__init__(store, job.run_id, Node.of_this_agent(job, (host, port)), s, port_picker=free_port, is_host=self.server is not None,
                         judge=Judge(job.straggler_threshold, job.straggler_period))

    def shutdown(self, succeeded: bool, why: str = "") -> None:
        """Leave the job, then close the connection and the store server (the host leaves last)."""
        super().shutdown(succeeded, why)
        self.store.close()
        if self.server is not None:
            self.server.close()
            self.server = None


def store_main(host: str, port: int, serving: Callable[[int], None]) -> int:
    """`python -m launcher store`: serve a rendezvous store until SIGTERM or SIGINT; `serving(port)` once it listens."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:  # a connection or two per agent: thousands of nodes need more than the usual 1,024
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = serve(host, port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    serving(server.port)
    stop.wait()
    server.close()
    return 0
