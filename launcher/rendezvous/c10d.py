"""The c10d backend: the protocol on a TCPStore, spoken by our own pure-Python client and server.

`launcher/tcpstore/` speaks torch's TCPStore wire protocol, so the agent never imports torch: a torch
TCPStore server can host the store, and torch clients can use ours. The store binds exactly the
address it was given (torch binds the wildcard). Who hosts: `--rdzv_conf is_host=` when given, else
the node whose own address is the endpoint's (checked by binding it, which is what counts).
`python -m launcher store` runs the store on its own, outside any training node.

Crash at connection speed: our server has held keys (tcpstore's SESSION/HOLD/WAIT_CHANGE), bound to
the agent's session: `Capability.CRASH`. The server cannot tell a dead agent from a cut connection,
so it keeps a session's keys for its lease (tcpstore.GRACE, 5 s) after the last connection closed,
and the agent's guard process, which knows the agent died, sends the store its death certificate
(`last_will`: END_SESSION) at once: the `alive` key goes, the neighbour's WAIT_CHANGE wakes. The
agent's connections (the main one and the watcher's) share one session id, so a connection that
closes alone is no death, and one that breaks (closed, reset, or no answer within `read_timeout`)
is reopened in the session for up to RECONNECT_WITHIN (back within the lease, it deletes nothing).
An agent that leaves ends its session itself.
A store that restarted meanwhile is an error, never an empty store to carry on with. Heartbeats
still judge a frozen or cut-off node. On torch's own server (which hangs up on the probe) the
adapter is plain, never reconnects, and heartbeats alone judge liveness.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
from collections.abc import Callable, Sequence

from ..errors import RendezvousConnectionError, RendezvousError
from ..net import free_port, is_local_address
from ..tcpstore import CHANGED, GONE, StoreClient, StoreError, StoreRestarted, StoreServer
from ..tcpstore.wire import death_certificate
from .api import JobParams, LastWill
from .protocol import ElasticRendezvous
from .records import Node, printable, read_counter
from .settings import C10dSettings
from .store import Capability, Change

log = logging.getLogger(__name__)
PREFIX = "launcher/"

# Beyond read_timeout (the longest a store may take to answer), how long a broken connection to our
# store is reopened: an agent facing a frozen store or a partitioned network gives up after
# read_timeout + 5 s at most, as before connections were reopened (on torch's store: read_timeout).
RECONNECT_WITHIN = 5.0


class TCPStoreAdapter:
    """The protocol's `Store` operations on one TCPStore client connection.

    `session`: the agent's session id, shared by its clones (a new one when None); the connection
    joins it where the server has our extension, and the adapter then declares `Capability.CRASH`.
    A broken connection is reopened for up to RECONNECT_WITHIN (see StoreClient); `boot`: the store
    process the session began on (a clone's), so a clone never starts on a restarted store.
    """

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float,
        connect_timeout: float | None = None,
        session: int | None = None,
        boot: int | None = None,
    ):
        self.host, self.port, self.timeout = host, port, timeout
        self.session = random.getrandbits(63) if session is None else session
        try:
            self.client = StoreClient(
                host,
                port,
                timeout,
                connect_timeout or timeout,
                session=self.session,
                reconnect=RECONNECT_WITHIN,
                boot=boot,
            )
        except StoreRestarted:
            raise RendezvousConnectionError(self._restarted()) from None
        except StoreError as e:
            raise RendezvousConnectionError(f"cannot reach the rendezvous store at {host}:{port}: {e}") from None
        self.capabilities = frozenset(
            {Capability.DELETE, Capability.CRASH} if self.client.extended else {Capability.DELETE}
        )

    def _restarted(self) -> str:
        return (
            f"the rendezvous store restarted and lost the job's state ({self.host}:{self.port} is a new store process)"
        )

    def _call(self, op: str, *args):
        try:
            return getattr(self.client, op)(*args)
        except StoreRestarted:
            raise RendezvousConnectionError(self._restarted()) from None
        except StoreError as e:
            raise RendezvousConnectionError(f"rendezvous store at {self.host}:{self.port}: {e}") from None

    def add(self, key: str, amount: int) -> int:
        try:
            return self.client.add(PREFIX + key, amount)
        except StoreRestarted:
            raise RendezvousConnectionError(self._restarted()) from None
        except StoreError as e:
            raise self._add_failed(key, e) from None

    def _add_failed(self, key: str, e: StoreError) -> RendezvousError:
        """A store hangs up on an ADD to a value that is no number (as torch's does): tell that from a
        lost store by reading the value back on a second connection (this one is given up)."""
        lost = RendezvousConnectionError(f"rendezvous store at {self.host}:{self.port}: {e}")
        try:
            reader = self.clone()
        except RendezvousError:
            return lost
        try:
            held = reader.get(key)
        except RendezvousError:
            return lost
        finally:
            reader.close()
        if read_counter(held) is not None:  # absent, or a number: the store itself went away
            return lost
        return RendezvousError(
            f"the rendezvous store's counter {key} holds {printable(held, 40)!r}, not a number: "
            "something other than this job's nodes writes under its prefix"
        )

    def get(self, key: str) -> bytes | None:
        k = PREFIX + key
        if self.client.extended:  # our server answers an absent key with b"" at once
            return self._call("get", k, False) or None
        return self._call("get", k, False) if self._call("check", [k]) else None

    def set(self, key: str, value: bytes) -> None:
        self._call("set", PREFIX + key, value)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self._call("compare_set", PREFIX + key, expected, desired)

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        """True once every key exists; False when the store says `timeout` passed first."""
        return self._call("wait", [PREFIX + k for k in keys], timeout)

    def wait_get(self, key: str, timeout: float) -> bytes | None:
        """The value once `key` exists; None when `timeout` passed first."""
        return self.get(key) if self.wait([key], timeout) else None

    def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        """One MULTI_GET; b"" for an absent key. torch's legacy server hangs up on an absent key, so
        there (no extension) the keys are checked first, and read one by one when some are absent."""
        ks = [PREFIX + k for k in keys]
        if self.client.extended or self._call("check", ks):
            return self._call("multi_get", ks, False)
        return [self.get(k) for k in keys]

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        self._call("multi_set", [PREFIX + k for k in keys], list(values))

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._call("delete_key", PREFIX + key)

    def hold(self, key: str) -> None:
        """`key` exists while any connection of this agent's session is open (Capability.CRASH)."""
        self._call("hold", PREFIX + key, b"1")

    def wait_change(self, change: str, alive: str | None, timeout: float) -> Change | None:
        """CHANGED once `change` exists, GONE once `alive` was deleted (its agent's connections all
        closed), None at the timeout (Capability.CRASH)."""
        got = self._call("wait_change", PREFIX + change, None if alive is None else PREFIX + alive, timeout)
        return {CHANGED: Change.CHANGED, GONE: Change.GONE}.get(got)

    def last_will(self) -> LastWill | None:
        """The death certificate of this agent's session, where the server takes one (version 3)."""
        if self.client.version < 3:
            return None
        return LastWill(self.host, self.port, death_certificate(self.session), answer=5)  # SESSION's u32, END's u8

    def end_session(self) -> None:
        """This agent leaves: its held keys go now, not at the end of the lease."""
        try:
            if not self.client.busy:
                self.client.end_session()
                return
            # The joining thread may be blocked in a WAIT on this connection (seconds): end the
            # session on a connection of its own rather than wait for that answer.
            other = self.clone()
            try:
                other.client.end_session()
            finally:
                other.close()
        except (StoreError, RendezvousError):  # gone already: the lease ends it
            log.debug("ending the store session failed", exc_info=True)

    def clone(self) -> TCPStoreAdapter:
        """A second connection in the same session."""
        return TCPStoreAdapter(self.host, self.port, self.timeout, session=self.session, boot=self.client.boot)

    def close(self) -> None:
        self.client.close()


# Connections an agent opens to the rendezvous store (the main one and the watcher's), with room for
# `launcher status` and a reconnect that overlaps its broken connection.
CONNECTIONS_PER_NODE = 3


def serve(host: str, port: int, nodes: int = 0) -> StoreServer:
    """Start a TCPStore server (a thread of this process) bound to exactly `host:port`, for up to
    `nodes` agents (it raises the descriptor limit, and says when that is too low for them)."""
    return StoreServer(host, port, expect=CONNECTIONS_PER_NODE * nodes)


class C10dRendezvous(ElasticRendezvous):
    """ElasticRendezvous on a TCPStore, hosting the store here when this node is the endpoint."""

    def __init__(self, settings: C10dSettings, job: JobParams):
        host, port, s = settings.host, settings.port, settings.rdzv
        self.server = None
        wants_host = s.is_host if s.is_host is not None else is_local_address(host)
        if wants_host:
            try:
                self.server = serve(host, port, job.max_nodes)
            except OSError:
                if s.is_host:
                    raise RendezvousConnectionError(
                        f"cannot host the rendezvous store on {host}:{port}: port taken"
                    ) from None
                # another agent on this machine hosts it already: be a client
        store = TCPStoreAdapter(host, port, s.read_timeout, connect_timeout=s.join_timeout)
        super().__init__(
            store,
            job.run_id,
            Node.of_this_agent(job, (host, port)),
            s,
            port_picker=free_port,
            is_host=self.server is not None,
        )

    def last_will(self) -> LastWill | None:
        """What this agent's guard sends the store if the agent dies: its session ends at once."""
        return self.store.last_will()

    def shutdown(self, succeeded: bool, why: str = "") -> None:
        """Leave the job, then end the session, close the connection and the store server (the host leaves last)."""
        super().shutdown(succeeded, why)
        self.store.end_session()
        self.store.close()
        if self.server is not None:
            self.server.close()
            self.server = None


def store_main(host: str, port: int, serving: Callable[[int], None]) -> int:
    """`python -m launcher store`: serve a rendezvous store until SIGTERM or SIGINT; `serving(port)` once it listens."""
    server = serve(host, port)  # it raises the descriptor limit to the hard one
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    serving(server.port)
    stop.wait()
    server.close()
    return 0
