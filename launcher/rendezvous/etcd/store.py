"""`EtcdStore`: the protocol's Store operations on one etcd client (an engine, see `engine`).

The Store operations, under `/launcher/<run_id>/`:
- add: a counter is its key's *version*, which every put bumps atomically, so `add(k, 1)` is one
  put and N nodes taking tickets at once never retry (a compare-and-swap loop on the value costs
  O(N²) attempts then); `add(k, 0)` reads the version;
- compare_set: one txn (expected b"" means absent: version 0);
- wait and wait_change: a watch from now (etcd keeps it synced), then one read (one txn over the
  keys, or a prefix range); events older than the read are ignored: no poll, no missed event.
  The watch is kept open across calls on the same keys;
- multi_get, multi_set and delete: one txn per 128 keys (etcd's default --max-txn-ops).

Liveness is `lease.Lease`: `hold` puts a key on this agent's lease; `wait_change` watches a
neighbour's alive key vanish.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ...errors import RendezvousConnectionError, RendezvousError
from ..store import Capability, Change
from .engine import ROOT, Compare, Delete, Engine, ErrorKind, EtcdError, Get, Put, Watch, range_end
from .settings import EtcdOptions

log = logging.getLogger(__name__)
TXN_OPS = 128  # etcd's default --max-txn-ops
FEW_KEYS = 4  # waits on more keys than this watch their common prefix instead of each key


# ---------------------------------------------------------------------------- the client


class _Shared:
    """What the clients of one agent share: the gateway's Session (connections, login)."""

    def __init__(self) -> None:
        self.session = None
        self.lock = threading.Lock()


class _Client:
    """One engine (`opts.engine`) with its own request timeout, made on first use; clients made
    with `sibling` share the gateway's connections and login."""

    def __init__(self, opts: EtcdOptions, timeout: float | None = None, *, shared: _Shared | None = None):
        self.opts = opts
        self.timeout = timeout or opts.timeout
        self.owner = shared is None  # the agent's first client: it owns the gateway's shared connections
        self.shared = shared or _Shared()
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    def get(self) -> Engine:
        with self._lock:
            if self._engine is None:
                self._engine = self._make()
            return self._engine

    def _make(self) -> Engine:
        if self.opts.engine == "grpc":
            try:
                from .grpc_engine import Grpc
            except ImportError as e:  # checked at config time; an install changed under a running agent
                from ...install import command

                raise RendezvousError(f"--rdzv_conf engine=grpc: {e}; {command('etcd-grpc')}") from None

            return Grpc(self.opts, self.timeout)
        from .gateway import Gateway, Session

        with self.shared.lock:
            if self.shared.session is None:
                self.shared.session = Session(self.opts)
            return Gateway(self.opts, self.timeout, self.shared.session, owner=self.owner)

    def sibling(self, timeout: float | None = None) -> _Client:
        return _Client(self.opts, timeout or self.timeout, shared=self.shared)

    def close(self) -> None:
        with self._lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()


def _hint(why: str, opts: EtcdOptions) -> str:
    """What a user can check when the cluster never answered."""
    low = why.lower()
    if not opts.tls and "closed" in low:  # a TLS listener hangs up on plain HTTP (and gRPC: "Socket closed")
        return "; if etcd serves TLS, pass --rdzv_conf cacert=PATH"
    if "handshake" in low and opts.tls:
        return "; does etcd serve TLS at that address?"
    return ""


class LeaseLost(Exception):
    """etcd no longer knows this agent's lease."""


class Holder(Protocol):
    """What the store asks of this agent's lease (`lease.Lease`, which calls etcd through the store)."""

    waiting: set[Watch]  # the watches of this agent's open waits

    def start(self, via: EtcdStore, retry_for: float) -> None: ...
    def hold(
        self, name: bytes, value: bytes, via: EtcdStore, retry_for: float | None = None, sweep: tuple | None = None
    ) -> None: ...
    def failing(self) -> tuple[float, str]: ...
    def revoke(self, via: EtcdStore) -> None: ...


# ---------------------------------------------------------------------------- the store


@dataclass
class _Follow:
    """Watches kept open between waits on the same keys, with what they have told so far."""

    names: tuple[bytes, ...]
    present: dict[bytes, bool]
    values: dict[bytes, bytes]  # of the present keys, when few are followed
    engine: Engine
    watch: Watch
    revision: int  # `present` holds at this revision: older events are in it already


class EtcdStore:
    """The protocol's Store operations, plus `hold` and `wait_change` liveness, on one etcd client."""

    capabilities = frozenset({Capability.DELETE, Capability.LIVENESS})

    def __init__(
        self,
        opts: EtcdOptions,
        lease: Holder | None = None,
        *,
        retry_for: float = 60.0,
        client: _Client | None = None,
        owns_client: bool | None = None,
    ):
        self.opts = opts
        self.lease = lease
        self.retry_for = retry_for  # how long one operation retries a cluster that does not answer
        self.client = client or _Client(opts)
        self._owns_client = client is None if owns_client is None else owns_client
        self._follow: _Follow | None = None
        self.rpcs = 0  # requests sent, for the benchmarks

    # ------------------------------------------------------------------ Store

    def add(self, key: str, amount: int) -> int:
        name = _name(key)
        if amount == 0:
            return self._call(lambda e: _version(e.range(name)[0]))
        if amount < 0:
            raise ValueError("etcd counters only grow")
        version = 0
        for _ in range(amount):  # not idempotent: retried only when the put surely never left
            version = self._call(lambda e: _bumped(e.put(name, b"", prev_kv=True)), idempotent=False)
        return version

    def get(self, key: str) -> bytes | None:
        name = _name(key)
        return self._call(lambda e: _value(e.range(name)[0]))

    def set(self, key: str, value: bytes) -> None:
        name = _name(key)
        self._call(lambda e: e.put(name, value))

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        name = _name(key)
        cond = Compare(name, "version", 0) if expected == b"" else Compare(name, "value", expected)

        def txn(e: Engine) -> bytes:
            ok, res, _ = e.txn([cond], [Put(name, desired)], [Get(name)])
            # Idempotent: a retry after a lost reply finds our own value and returns it.
            return desired if ok else (res[0][0].value if res and res[0] else b"")

        return self._call(txn)

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        names = tuple(_name(k) for k in keys)
        return bool(self._wait_for(names, timeout, lambda f: True if all(f.present.values()) else None))

    def wait_get(self, key: str, timeout: float) -> bytes | None:
        """The value once `key` exists (from the read or the watch event: one request fewer than
        wait and get); None at the timeout."""
        name = _name(key)
        return self._wait_for((name,), timeout, lambda f: f.values.get(name, b"") if f.present[name] else None)

    def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        out: list = []
        for chunk in _chunks([_name(k) for k in keys]):
            _, res, _ = self._call(lambda e, ch=chunk: e.txn([], [Get(n) for n in ch], []))
            out += [r[0].value if r else None for r in res]
        return out

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        pairs = list(zip([_name(k) for k in keys], values))
        for chunk in _chunks(pairs):
            self._call(lambda e, ch=chunk: e.txn([], [Put(n, v) for n, v in ch], []))

    def delete(self, keys: Sequence[str]) -> None:
        """Delete `keys` (old rounds' per-node keys, so a long job keeps a few keys per round); a key this
        agent held is no longer held (a new lease does not bring it back)."""
        names = [_name(k) for k in keys]
        if self.lease is not None:
            for name in names:
                self.lease.held.pop(name, None)
        for chunk in _chunks(names):
            self._call(lambda e, ch=chunk: e.txn([], [Delete(n) for n in ch], []))

    def clone(self) -> EtcdStore:
        return EtcdStore(
            self.opts, self.lease, retry_for=self.retry_for, client=self.client.sibling(), owns_client=True
        )

    def close(self) -> None:
        self._drop_follow()
        if self._owns_client:
            self.client.close()

    # ------------------------------------------------------------------ liveness

    def hold(self, key: str) -> None:
        """`key` lives on this agent's lease: it vanishes when the agent dies."""
        assert self.lease is not None, "hold needs a lease"
        self.lease.hold(_name(key), b"1", self)

    def wait_change(self, change: str, alive: str | None, timeout: float) -> Change | None:
        """CHANGED once `change` exists, GONE once `alive` is absent, None at the timeout or on trouble.
        Raises RendezvousConnectionError once this agent's lease refreshes have failed for longer than
        `retry_for`: a watch on a cut connection stays silent, so only the refreshes tell."""
        names = (_name(change),) + ((_name(alive),) if alive else ())

        def decide(f: _Follow) -> Change | None:
            if f.present[names[0]]:
                return Change.CHANGED
            return Change.GONE if alive and not f.present[names[1]] else None

        got = self._wait_for(names, timeout, decide)
        if got is None and self.lease is not None:
            failing, why = self.lease.failing()
            if failing > self.retry_for:  # cut off: the others have dropped this node by now (its lease TTL)
                raise RendezvousConnectionError(
                    f"cannot reach etcd at {self.opts.where}: {why} (no answer for {failing:.0f} s, "
                    f"read_timeout {self.retry_for:g} s)"
                )
        return got

    # ------------------------------------------------------------------ the agent's life

    def register(self, run_id: str, node_id: str, retry_for: float) -> None:
        """Take a lease and sign in under the run; the first agent in wipes a dead run's leftovers."""
        assert self.lease is not None, "register needs a lease"
        self.lease.start(self, retry_for)
        self.sign_in(run_id, node_id, retry_for)

    def sign_in(self, run_id: str, node_id: str, retry_for: float) -> None:
        """Put `agents/<node>` on the lease; the first agent in, finding nobody signed in, does it in
        one txn with the sweep of a dead run's leftovers.

        Who is signed in is read first with a limit of one key: the sweep's compare reads every
        key of its range, O(N) per sign-in and O(N²) for a job (8 s of etcd's CPU at 4,096 nodes),
        so only agents that found the range empty send it (two at once: the second one's compare
        fails, and it just signs in)."""
        assert self.lease is not None, "sign_in needs a lease"
        agents = _job(run_id)[1]
        me = agents + node_id.encode()
        _, found, _ = self._call(
            lambda e: e.txn([], [Get(agents, range_end(agents), keys_only=True, limit=1)], []), retry_for=retry_for
        )
        self.lease.hold(me, b"1", self, retry_for, sweep=None if found[0] else _sweep(run_id, keep=me))

    def leave(self, run_id: str) -> None:
        """Give the lease back (our keys vanish); the last agent out deletes the run's keys."""
        if self.lease:
            self.lease.revoke(self)
        self._call(lambda e: e.txn(*_sweep(run_id, keep=_job(run_id)[0] + b"closed")), retry_for=2.0)

    # ------------------------------------------------------------------ requests

    def _call(self, fn: Callable, *, idempotent: bool = True, retry_for: float | None = None):
        """Run `fn(engine)`, retrying while the cluster does not answer (with backoff) up to `retry_for`."""
        limit = self.retry_for if retry_for is None else retry_for
        if self.lease is not None and self.lease.failing()[0] > self.retry_for:
            # Cut off (`wait_change` said so): the others dropped this agent with its lease, and each
            # retry would only hold up its end (the board's last report, goodput, leave): one try each.
            limit = 0.0
        start = time.monotonic()
        delay, told = 0.05, False
        while True:
            self.rpcs += 1
            try:
                return fn(self.client.get())
            except EtcdError as e:
                if e.kind is ErrorKind.FATAL:
                    raise RendezvousError(e.why) from None
                if e.kind is ErrorKind.LEASE:
                    raise LeaseLost(e.why) from None
                if not idempotent and not e.unsent:
                    raise RendezvousConnectionError(
                        f"etcd at {self.opts.where} failed mid-request ({e.why}); a counter may be off"
                    ) from None
                why = e.why
            except Exception as e:  # a client bug, not an etcd answer
                raise RendezvousError(f"etcd client error: {type(e).__name__}: {e}") from None
            waited = time.monotonic() - start
            if waited + delay > limit:
                raise RendezvousConnectionError(
                    f"cannot reach etcd at {self.opts.where}: {why} (retried for {limit:g} s){_hint(why, self.opts)}"
                )
            if waited >= 1.0 and not told and limit >= 5.0:
                told = True
                log.info(
                    f"etcd at {self.opts.where} does not answer ({why}); "
                    f"retrying for up to {limit:g} s{_hint(why, self.opts)}"
                )
            time.sleep(delay)
            delay = min(2 * delay, 1.0)

    def _wait_for(self, names: tuple[bytes, ...], timeout: float, decide: Callable[[_Follow], object]):
        """Follow `names` until `decide(follow)` answers; None at the timeout. Trouble is retried, not raised."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            try:
                return self._follow_until(names, deadline, decide)
            except EtcdError as e:
                self._drop_follow()
                if e.kind is ErrorKind.FATAL:
                    raise RendezvousError(e.why) from None
            except Exception as e:  # a client bug, not an etcd answer
                self._drop_follow()
                raise RendezvousError(f"etcd client error: {type(e).__name__}: {e}") from None
            if time.monotonic() + delay >= deadline:
                return None
            time.sleep(delay)
            delay = min(2 * delay, 1.0)

    def _follow_until(self, names: tuple[bytes, ...], deadline: float, decide: Callable):
        engine = self.client.get()
        f = self._follow
        if f is None or f.names != names or f.engine is not engine:
            self._drop_follow()
            # The watch first, from etcd's current revision, then the read: no event falls between
            # them, and etcd keeps the watch in its synced group. A watch from a past revision
            # (read, then watch from the read's) joins the unsynced group, which etcd catches up
            # by reading its history: with thousands of nodes waiting, that is most of its work.
            watch = self._watch(engine, names)
            try:
                present, values, revision = self._read(engine, names)
            except BaseException:
                self._drop(watch)
                raise
            f = self._follow = _Follow(names, present, values, engine, watch, revision)
            answer = decide(f)
            if answer is not None:
                self._drop_follow()
                return answer
        while True:
            events = f.watch.next(deadline)
            if events is None:
                if f.watch.woken:  # the agent is leaving
                    self._drop_follow()
                return None  # else keep the watches: the caller usually asks again about the same keys
            for e in events:
                if e.key in f.present and e.revision > f.revision:
                    f.present[e.key] = e.put
                    f.values[e.key] = e.value
            answer = decide(f)
            if answer is not None:
                self._drop_follow()
                return answer

    def _read(self, engine: Engine, names: tuple[bytes, ...]) -> tuple[dict[bytes, bool], dict[bytes, bytes], int]:
        """Which of `names` exist, their values when few (the protocol's are small), and the
        revision that answer holds at (one request)."""
        self.rpcs += 1
        if len(names) <= FEW_KEYS:
            _, res, revision = engine.txn([], [Get(n) for n in names], [])
            return {n: bool(r) for n, r in zip(names, res)}, {n: r[0].value for n, r in zip(names, res) if r}, revision
        prefix = os.path.commonprefix(list(names))
        kvs, revision = engine.range(prefix, range_end(prefix), keys_only=True)
        found = {kv.key for kv in kvs}
        return {n: n in found for n in names}, {}, revision

    def _watch(self, engine: Engine, names: tuple[bytes, ...]) -> Watch:
        """A watch on `names` (each key, or their common prefix when many) from now on."""
        if len(names) <= FEW_KEYS:
            ranges = [(n, None) for n in names]
        else:
            prefix = os.path.commonprefix(list(names))
            ranges = [(prefix, range_end(prefix))]
        self.rpcs += 1
        watch = engine.watch(ranges)
        if self.lease:
            self.lease.waiting.add(watch)
        return watch

    def _drop(self, watch: Watch) -> None:
        if self.lease:
            self.lease.waiting.discard(watch)
        watch.close()

    def _drop_follow(self) -> None:
        f, self._follow = self._follow, None
        if f is not None:
            self._drop(f.watch)


def _name(key: str) -> bytes:
    return (ROOT + key).encode()


def _job(run_id: str) -> tuple[bytes, bytes]:
    job = f"{ROOT}{run_id}/".encode()
    return job, job + b"agents/"


def _sweep(run_id: str, keep: bytes | None = None) -> tuple[list, list, list]:
    """A txn that deletes the run's keys, all but `keep`, if no agent is signed in under it.

    The last agent out keeps `closed` (so a node that comes back late, its lease lost, learns that
    the job ended; the first agent of a new run deletes it); the first agent in keeps its own
    sign-in, put by the same txn (etcd refuses a txn whose put lies in a range it deletes)."""
    job, agents = _job(run_id)
    spans = [Delete(job, keep), Delete(keep + b"\0", range_end(job))] if keep else [Delete(job, range_end(job))]
    # A range compare holds for every key in the range; over no key, version == 0 holds.
    return [Compare(agents, "version", 0, range_end(agents))], spans, []


def _version(kvs) -> int:
    return kvs[0].version if kvs else 0


def _value(kvs) -> bytes | None:
    return kvs[0].value if kvs else None


def _bumped(prev) -> int:
    """A counter's value after one put: the key's version before it, plus one."""
    return prev.version + 1 if prev is not None else 1


def _chunks(items: list, size: int = TXN_OPS) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
