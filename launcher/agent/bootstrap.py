"""The workers' bootstrap store (MASTER_ADDR:MASTER_PORT), served by the agent of group rank 0.

torchrun's contract: TORCHELASTIC_USE_AGENT_STORE=True and every worker is a TCPStore client, so
code that connects with `is_server=False` on every rank works unchanged. Unlike torchrun, the
server is fresh every round (a restart never reads the last attempt's keys, pytorch#135712). It is
the launcher's pure-Python `StoreServer` (no torch in the agent): 1,024 ranks bootstrap through it
in 0.4 s with 0.1 s of CPU (scripts/bench/bootstrap_store.py). `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`,
torchrun's own switch, makes worker rank 0 host it instead (torch's C++ server; for big gloo jobs,
whose full-mesh start-up is N² store reads).

It also tells every node when the workers' process group formed: torch's default group names its
keys `default_pg/...` in this store (gloo's addresses at `init_process_group`, NCCL's id at the
first collective), and `inplace.Job`'s `launcher/inplace/<round>/pg/...`; once every worker's
connection has named one, the server stores FORMED_KEY, and each node's agent, waiting for that key
on a connection of its own (`GroupWatch`, a thread: the store's client loads there, off the start's
path), notes the time: the end of the workers' start-up (or of a restart) when the script reports no
steps (telemetry.goodput). A script that forms its group elsewhere (`init_method=`, its own store)
is never seen forming: its figures stay measured to the workers' start.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import re
import socket
import threading
import time
from collections.abc import Callable

from ..net import release_holds
from ..spec import Round
from ..tcpstore.server import StoreServer
from ..tcpstore.wire import KEY_PREFIX
from ..worker.inplace import keys

log = logging.getLogger(__name__)
DISABLE_VAR = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# In every key of torch's default process group (PrefixStore("default_pg"), the env:// init), or of
# the group `inplace.Job` forms on its own prefix store
GROUP_KEYS = re.compile(rb"default_pg/|" + re.escape(keys.NAMESPACE.encode()) + rb"/\d+/pg/")
FORMED_KEY = "launcher/group_formed"  # stored by the server once every worker named a GROUP_KEYS key


class BootstrapStore:
    """One round's store at a time; `open()` closes the last round's first."""

    def __init__(self, environ: dict[str, str], clock: Callable[[], float] = time.time):
        self.enabled = environ.get(DISABLE_VAR, "0") != "1"
        self.server: StoreServer | None = None
        self.watch: GroupWatch | None = None
        self.clock = clock
        self._records: dict[bytes, bytes] = {}  # the ranks' records, as the last round's store held them

    def open(self, rnd: Round) -> tuple[Round, str]:
        """The round as the workers should see it, and a problem to report ("" if none).

        Group rank 0 serves a fresh store on MASTER_PORT; if it cannot, its worker rank 0 hosts
        one as before (False there; the other nodes' workers are clients either way). A server still open
        on the round's port was kept for it (a round asked for in place, whose workers restart in it: the
        other nodes' workers are in it already; each round meets on its own prefix): it stays. The ranks'
        records (keys.SLOTS: each rank's own random streams and buffers by step) go on into the fresh one:
        a node lost whole takes its copies in memory with it, and its ranks' successors go on exactly from
        another node's copy with them (worker/inplace/memory.py). They are taken only at a step another
        rank holds a copy of, never as the last attempt's state."""
        if self.server is not None and rnd.group_rank == 0 and self.server.port == rnd.master_port:
            return dataclasses.replace(rnd, use_agent_store=True), ""
        self.close()
        # The ports this node picked (net.free_port holds each) are bound by now or never will be (another
        # node's won the round), but this round's MASTER_PORT on group rank 0 until its server binds it:
        # worker rank 0's binds it only after importing torch.
        release_holds(keep=rnd.master_port if rnd.group_rank == 0 else None)
        if not self.enabled:
            return rnd, ""
        if rnd.group_rank == 0:
            try:
                # every worker connects, and every node's agent once (its GroupWatch)
                self.server = _serve(rnd.master_addr, rnd.master_port, rnd.world_size + rnd.group_world_size)
            except OSError as e:
                return rnd, (
                    f"cannot serve the bootstrap store on {rnd.master_addr}:{rnd.master_port} "
                    f"({e.strerror or e}); worker rank 0 hosts it this round"
                )
            release_holds()
            formed = KEY_PREFIX + FORMED_KEY.encode()  # as a client names it on the wire
            self.server.announce_when_named(GROUP_KEYS, rnd.world_size, formed, lambda: b"1")
            self.server.data.update(self._records)  # before the round's workers exist: nobody reads it yet
        self.watch = GroupWatch(rnd.master_addr, rnd.master_port, self.clock)
        return dataclasses.replace(rnd, use_agent_store=True), ""

    def formed_at(self) -> float | None:
        """When this round's workers' process group formed (on `clock`), once it has; else None."""
        return self.watch.at if self.watch is not None else None

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        if self.server is not None:
            self.server.close()
            prefix = KEY_PREFIX + keys.SLOTS.encode()
            self._records = {k: v for k, v in self.server.data.items() if k.startswith(prefix)}
            self.server = None


class GroupWatch:
    """A thread that waits, on its own connection to the round's bootstrap store, for FORMED_KEY, and
    notes the time it came (`at`). It ends then, at `close()`, or when the store goes (the round ends)."""

    POLL = 0.5  # seconds: each wait and each try to connect, so that `close()` is heard within it
    CONNECT_FOR = 30.0  # seconds of tries to connect before the watch gives up

    def __init__(self, addr: str, port: int, clock: Callable[[], float]):
        self.at: float | None = None
        self._addr, self._port, self._clock = addr, port, clock
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="launcher-group-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` s for the thread to end (after `close`: within POLL)."""
        self._thread.join(timeout)

    def _run(self) -> None:
        from ..tcpstore.client import StoreClient, StoreError

        client = None
        try:
            # the server is up before any worker starts (group rank 0); another node's may be a moment later
            deadline = time.monotonic() + self.CONNECT_FOR
            while client is None and not self._closed.is_set():
                try:
                    # Tries of POLL s each, so that `close()` ends the thread: one 30 s try outlived its
                    # round, saying "cannot reach the store" of a store closed on purpose. Each try is
                    # within the client's TELL_AFTER, so it says nothing: an absent store is the
                    # workers' to report, not this watch's.
                    client = StoreClient(self._addr, self._port, timeout=10.0, connect_timeout=self.POLL)
                except StoreError:
                    if time.monotonic() >= deadline:
                        raise
            while client is not None and not self._closed.is_set():
                if client.wait([FORMED_KEY], timeout=self.POLL):
                    self.at = self._clock()
                    return
        except (StoreError, OSError, EOFError) as e:  # the round ended (its store closed) first
            log.debug("watching the workers' group form on %s:%s ended: %s", self._addr, self._port, e)
        finally:
            if client is not None:
                client.close()


def _serve(addr: str, port: int, expect: int) -> StoreServer:
    """Bind MASTER_ADDR itself where it is an address of this host, else every address (as torch's
    server); `expect` clients connect (the server raises the descriptor limit for them)."""
    try:
        return StoreServer(addr, port, expect=expect)
    except OSError as e:
        if e.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) and not isinstance(e, socket.gaierror):
            raise
    return StoreServer("::" if ":" in addr else "0.0.0.0", port, expect=expect)
