"""The etcd backend: the protocol on etcd's v3 API, behind one thin adapter, `EtcdStore`.

The client is `etcd-sdk-python` (module `pyetcd`, the maintained fork of python-etcd3, whose
0.12.0 cannot be imported with protobuf >= 4). Every use of it is in this file and imported
lazily, so `import launcher.cli` never loads grpc, and this path never imports torch.

The Store operations, under `/launcher/<run_id>/`:
- add: a counter is its key's *version*, which every put bumps atomically, so `add(k, 1)` is one
  put and N nodes taking tickets at once never retry (a compare-and-swap loop on the value costs
  O(N²) attempts then); `add(k, 0)` reads the version;
- compare_set: one txn (expected b"" means absent: version 0);
- wait and wait_change: one read, then a watch from the next revision (no poll, no missed event),
  kept open across calls on the same keys;
- multi_get and multi_set: one txn per 128 keys (etcd's default --max-txn-ops).

Liveness: each agent holds one lease (TTL = the liveness timeout, at least etcd's 2 s floor),
refreshed by a thread that rides out etcd restarts and leader changes (leases survive both) and
takes a new lease, with its keys, if the old one expired anyway. The agent's registration
`agents/<node>` and its alive keys live on that lease: a dead agent's keys vanish and its
neighbour's watch sees the DELETE. Clean-up: the last agent out deletes the run's keys; the first
agent of a new run, finding no agent registered, wipes whatever a killed run left behind.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

from ..config import DEFAULT_PORTS, ETCD_PASSWORD_ENV, ETCD_USER_ENV, LaunchConfig, RendezvousSettings, parse_endpoints
from ..errors import ConfigError, RendezvousConnectionError, RendezvousError
from ..logs import say
from ..process import free_port, hostname
from .c10d import interface_of, outward_address
from .protocol import ElasticRendezvous, Node

ROOT = "/launcher/"
TXN_OPS = 128  # etcd's default --max-txn-ops
MIN_TTL = 2  # etcd raises shorter leases to 1.5 election timeouts: 2 s at its defaults
FEW_KEYS = 4  # waits on more keys than this watch their common prefix instead of each key
# gRPC's reconnect backoff grows to 120 s by default: after an etcd restart we want it back at once.
GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
ENDPOINT_RETRY_S = 1.0  # pyetcd shuns a failed endpoint for 300 s by default: a restarted one never comes back


@dataclass(frozen=True)
class EtcdOptions:
    """How to reach and log in to the cluster; the password never shows in a repr."""

    endpoints: tuple[tuple[str, int], ...]
    tls: bool = False
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = 10.0  # one RPC

    @property
    def where(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.endpoints)


def options_from(config: LaunchConfig, environ: Mapping[str, str] = os.environ) -> EtcdOptions:
    """The cluster, TLS files and credentials of `config`; the password from the environment or its file."""
    conf = config.rdzv_conf
    password = environ.get(ETCD_PASSWORD_ENV) or None
    if conf.get("password_file"):
        try:
            with open(conf["password_file"]) as f:
                password = f.read().rstrip("\r\n")
        except OSError as e:
            raise ConfigError(f"--rdzv_conf password_file={conf['password_file']}: {e.strerror}") from None
    tls = conf.get("protocol") == "https" or "https://" in config.rdzv_endpoint or any(k in conf for k in ("cacert", "cert", "key"))
    return EtcdOptions(
        endpoints=parse_endpoints(config.rdzv_endpoint, DEFAULT_PORTS["etcd"]),
        tls=tls, cacert=conf.get("cacert"), cert=conf.get("cert"), key=conf.get("key"),
        user=conf.get("user") or environ.get(ETCD_USER_ENV) or None, password=password,
        timeout=min(config.rdzv.read_timeout, 10.0),
    )


def lease_ttl(settings: RendezvousSettings) -> int:
    """Whole seconds (etcd's unit), never below what etcd grants."""
    return max(MIN_TTL, math.ceil(settings.liveness_timeout))


# ---------------------------------------------------------------------------- the client


def _pyetcd():
    """Import grpc and pyetcd with gRPC's own logging off: a TLS mismatch prints dozens of C++ lines per second."""
    saved = os.environ.get("GRPC_VERBOSITY")
    os.environ["GRPC_VERBOSITY"] = "NONE"
    try:
        import grpc
        import pyetcd
    finally:  # workers must not inherit our quieting
        if saved is None:
            os.environ.pop("GRPC_VERBOSITY", None)
        else:
            os.environ["GRPC_VERBOSITY"] = saved
    return grpc, pyetcd


def _connect(opts: EtcdOptions, timeout: float):
    """A pyetcd client over every endpoint, with failover, logged in when a user is given."""
    grpc, pyetcd = _pyetcd()

    creds = None
    if opts.tls:
        creds = grpc.ssl_channel_credentials(_read(opts.cacert), _read(opts.key), _read(opts.cert))
    endpoints = [
        pyetcd.Endpoint(h, p, secure=opts.tls, creds=creds, time_retry=ENDPOINT_RETRY_S, opts=GRPC_OPTIONS)
        for h, p in opts.endpoints
    ]
    client = pyetcd.MultiEndpointEtcd3Client(endpoints, timeout=timeout, failover=True)
    # A member cut off from its leader answers from stale state and keeps watches silent:
    # "hasleader" makes it fail such requests and cancel such watches, so we fail over instead.
    client.metadata = (("hasleader", "true"),)
    if opts.user:
        _authenticate(client, opts)
    return client


def _authenticate(client, opts: EtcdOptions) -> None:
    """Log in on the first endpoint that answers (pyetcd's own login does not fail over)."""
    import grpc
    from pyetcd import etcdrpc

    request = etcdrpc.AuthenticateRequest(name=opts.user, password=opts.password or "")
    last: Exception | None = None
    for _ in opts.endpoints:
        try:
            token = client.authstub.Authenticate(request, client.timeout).token
        except grpc.RpcError as e:
            if "authentication is not enabled" in (e.details() or ""):
                return  # credentials are moot on this cluster
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            last = e
            client.endpoint_in_use.fail()
            client._clear_old_stubs()  # the next stub is made on the next live endpoint
            continue
        # Metadata, not call credentials: gRPC refuses those on a plain channel.
        client.metadata = (("hasleader", "true"), ("token", token))
        return
    assert last is not None
    raise last


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


class _Client:
    """One pyetcd client, made on first use and made again when etcd forgot our auth token."""

    def __init__(self, opts: EtcdOptions, timeout: float | None = None):
        self.opts = opts
        self.timeout = timeout or opts.timeout
        self._client = None
        self._lock = threading.Lock()

    def get(self):
        with self._lock:
            if self._client is None:
                self._client = _connect(self.opts, self.timeout)
            return self._client

    def reset(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass

    close = reset


def _classify(e: BaseException, opts: EtcdOptions) -> tuple[str, str]:
    """What an error from pyetcd or gRPC means: ("retry" | "reauth" | "lease" | "fatal", why in words)."""
    import grpc
    from pyetcd import exceptions as ex

    rpc = e if isinstance(e, grpc.RpcError) else e.__context__  # pyetcd re-raises without the details
    if not (isinstance(rpc, grpc.RpcError) and hasattr(rpc, "code")):
        if isinstance(e, ex.NoServerAvailableError):
            return "retry", "no endpoint answers"
        if isinstance(e, ex.Etcd3Exception):
            return "retry", str(e) or type(e).__name__
        return "fatal", f"etcd client error: {type(e).__name__}: {e}"
    code, details = rpc.code(), rpc.details() or ""
    low, S = details.lower(), grpc.StatusCode
    # A refused certificate is fatal; a handshake cut short ("Endpoint closing") is an etcd restarting.
    if any(s in low for s in ("certificate", "unwrap failed", "tsi_data_corrupted", "ssl_error_ssl")):
        return "fatal", f"TLS with etcd at {opts.where} failed ({details}); check --rdzv_conf cacert=, cert=, key="
    if "authentication failed" in low:
        return "fatal", f"etcd at {opts.where} rejected user {opts.user!r}: wrong user name or password"
    if "invalid auth token" in low or code == S.UNAUTHENTICATED:
        if opts.user:
            return "reauth", details  # etcd restarted and forgot its tokens: log in again
        return "fatal", _needs_login(opts)
    if "user name is empty" in low:
        return "fatal", _needs_login(opts)
    if code == S.PERMISSION_DENIED or "permission denied" in low:
        who = f"user {opts.user!r}" if opts.user else "this client (no user given)"
        return "fatal", f"etcd at {opts.where} denied {who} access to {ROOT} (permission denied); grant its role readwrite on that prefix"
    if "requested lease not found" in low:
        return "lease", details
    if code in (S.UNAVAILABLE, S.DEADLINE_EXCEEDED, S.INTERNAL, S.RESOURCE_EXHAUSTED, S.CANCELLED, S.UNKNOWN, S.ABORTED):
        return "retry", details or code.name
    return "fatal", f"etcd at {opts.where} refused a request: {details or code.name}"


def _hint(why: str, opts: EtcdOptions) -> str:
    """What a user can check when the cluster never answered."""
    low = why.lower()
    if "socket closed" in low and not opts.tls:
        return "; if etcd serves TLS, pass --rdzv_conf cacert=PATH"
    if "handshake" in low and opts.tls:
        return "; does etcd serve TLS at that address?"
    return ""


def _needs_login(opts: EtcdOptions) -> str:
    return (f"etcd at {opts.where} requires a login: set {ETCD_USER_ENV} and {ETCD_PASSWORD_ENV} "
            f"(or --rdzv_conf user=NAME,password_file=PATH)")


def _unsent(e: BaseException) -> bool:
    """True when the request surely never reached etcd, so even a counter bump may be retried."""
    if type(e).__name__ == "NoServerAvailableError":
        return True
    details = str(getattr(e.__context__, "details", lambda: "")() or "") + str(getattr(e, "details", lambda: "")() or "")
    return any(s in details.lower() for s in ("failed to connect", "connection refused", "no address"))


class _LeaseLost(Exception):
    """etcd no longer knows this agent's lease."""


# ---------------------------------------------------------------------------- the store


@dataclass
class _Follow:
    """Watches kept open between waits on the same keys, with what they have told so far."""

    names: tuple[bytes, ...]
    present: dict[bytes, bool]
    client: object
    ids: list
    events: queue.SimpleQueue


class EtcdStore:
    """The protocol's Store operations, plus `hold` and `wait_change` liveness, on one etcd client."""

    def __init__(self, opts: EtcdOptions, lease: "Lease | None" = None, *, retry_for: float = 60.0, client: _Client | None = None):
        self.opts = opts
        self.lease = lease
        self.retry_for = retry_for  # how long one operation retries a cluster that does not answer
        self.client = client or _Client(opts)
        self._owns_client = client is None
        self._follow: _Follow | None = None
        self.rpcs = 0  # requests sent, for the benchmarks

    # ------------------------------------------------------------------ Store

    def add(self, key: str, amount: int) -> int:
        name = _name(key)
        if amount == 0:
            return self._call(lambda c: _version(c.get_response(name)))
        if amount < 0:
            raise ValueError("etcd counters only grow")
        version = 0
        for _ in range(amount):  # not idempotent: retried only when the put surely never left
            version = self._call(lambda c: _put_version(c.put(name, b"", prev_kv=True)), idempotent=False)
        return version

    def get(self, key: str) -> bytes | None:
        name = _name(key)
        return self._call(lambda c: c.get(name)[0])

    def set(self, key: str, value: bytes) -> None:
        name = _name(key)
        self._call(lambda c: c.put(name, value))

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        name = _name(key)

        def txn(c) -> bytes:
            t = c.transactions
            cond = t.version(name) == 0 if expected == b"" else t.value(name) == expected
            ok, res = c.transaction(compare=[cond], success=[t.put(name, desired)], failure=[t.get(name)])
            # Idempotent: a retry after a lost reply finds our own value and returns it.
            return desired if ok else (res[0][0][0] if res and res[0] else b"")

        return self._call(txn)

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        names = tuple(_name(k) for k in keys)
        return bool(self._wait_for(names, timeout, lambda present: True if all(present.values()) else None))

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        out: list = []
        for chunk in _chunks([_name(k) for k in keys]):
            res = self._call(lambda c, ch=chunk: c.transaction(compare=[], success=[c.transactions.get(n) for n in ch], failure=[])[1])
            out += [r[0][0] if r else None for r in res]
        return out

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        pairs = list(zip([_name(k) for k in keys], values))
        for chunk in _chunks(pairs):
            self._call(lambda c, ch=chunk: c.transaction(compare=[], success=[c.transactions.put(n, v) for n, v in ch], failure=[]))

    def clone(self) -> "EtcdStore":
        return EtcdStore(self.opts, self.lease, retry_for=self.retry_for)

    def close(self) -> None:
        self._drop_follow()
        if self._owns_client:
            self.client.close()

    # ------------------------------------------------------------------ liveness

    def hold(self, key: str) -> None:
        """`key` lives on this agent's lease: it vanishes when the agent dies."""
        assert self.lease is not None, "hold needs a lease"
        self.lease.hold(_name(key), b"1", self)

    def wait_change(self, change: str, alive: str | None, timeout: float) -> str | None:
        """"change" once `change` exists, "gone" once `alive` is absent, None at the timeout or on trouble."""
        names = (_name(change),) + ((_name(alive),) if alive else ())

        def decide(present: dict[bytes, bool]) -> str | None:
            if present[names[0]]:
                return "change"
            return "gone" if alive and not present[names[1]] else None

        return self._wait_for(names, timeout, decide)

    # ------------------------------------------------------------------ the agent's life

    def register(self, run_id: str, node_id: str, retry_for: float) -> None:
        """Take a lease and sign in under the run; the first agent in wipes a dead run's leftovers."""
        assert self.lease is not None, "register needs a lease"
        job, agents = _job(run_id)
        self.lease.start(self, retry_for)

        def wipe(c) -> bool:
            t = c.transactions
            # A range compare holds for every key in the range; over no key, version == 0 holds.
            nobody = t.version(agents, range_end=_range_end(agents)) == 0
            return c.transaction(compare=[nobody], success=[t.delete(job, range_end=_range_end(job))], failure=[])[0]

        self._call(wipe, retry_for=retry_for)
        self.lease.hold(agents + node_id.encode(), b"1", self, retry_for)

    def leave(self, run_id: str) -> None:
        """Give the lease back (our keys vanish); the last agent out deletes the run's keys."""
        job, agents = _job(run_id)
        if self.lease:
            self.lease.revoke(self)

        def sweep(c) -> None:
            t = c.transactions
            nobody = t.version(agents, range_end=_range_end(agents)) == 0
            c.transaction(compare=[nobody], success=[t.delete(job, range_end=_range_end(job))], failure=[])

        self._call(sweep, retry_for=2.0)

    # ------------------------------------------------------------------ requests

    def _call(self, fn: Callable, *, idempotent: bool = True, retry_for: float | None = None):
        """Run `fn(client)`, retrying while the cluster does not answer (with backoff) up to `retry_for`."""
        limit = self.retry_for if retry_for is None else retry_for
        start = time.monotonic()
        delay, told, relogged = 0.05, False, False
        while True:
            self.rpcs += 1
            try:
                return fn(self.client.get())
            except Exception as e:
                kind, why = _classify(e, self.opts)
                if kind == "fatal":
                    raise RendezvousError(why) from None
                if kind == "lease":
                    raise _LeaseLost(why) from None
                if kind == "reauth":
                    self.client.reset()  # the request was refused, not applied: log in again and resend
                    if not relogged:
                        relogged = True
                        continue
                elif not idempotent and not _unsent(e):
                    raise RendezvousConnectionError(f"etcd at {self.opts.where} failed mid-request ({why}); a counter may be off") from None
            waited = time.monotonic() - start
            if waited + delay > limit:
                hint = _hint(why, self.opts)
                raise RendezvousConnectionError(f"cannot reach etcd at {self.opts.where}: {why} (retried for {limit:g} s){hint}")
            if waited >= 1.0 and not told and limit >= 5.0:
                told = True
                say(f"etcd at {self.opts.where} does not answer ({why}); retrying for up to {limit:g} s")
            time.sleep(delay)
            delay = min(2 * delay, 1.0)

    def _wait_for(self, names: tuple[bytes, ...], timeout: float, decide: Callable[[dict[bytes, bool]], object]):
        """Follow `names` until `decide(present)` answers; None at the timeout. Trouble is retried, not raised."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            try:
                return self._follow_until(names, deadline, decide)
            except Exception as e:
                self._drop_follow()
                kind, why = _classify(e, self.opts)
                if kind == "fatal":
                    raise RendezvousError(why) from None
                if kind == "reauth":
                    self.client.reset()
            if time.monotonic() + delay >= deadline:
                return None
            time.sleep(delay)
            delay = min(2 * delay, 1.0)

    def _follow_until(self, names: tuple[bytes, ...], deadline: float, decide: Callable):
        client = self.client.get()
        f = self._follow
        if f is None or f.names != names or f.client is not client:
            self._drop_follow()
            present, revision = self._read(client, names)
            answer = decide(present)
            if answer is not None:
                return answer
            f = self._follow = self._watch(client, names, present, revision)
        while True:
            try:
                item = f.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None  # keep the watches: the caller usually asks again about the same keys
            if item is None:
                return None  # woken: the agent is leaving
            if isinstance(item, Exception):
                raise item
            for event in item.events:
                if event.key in f.present:
                    f.present[event.key] = type(event).__name__ == "PutEvent"
            answer = decide(f.present)
            if answer is not None:
                self._drop_follow()
                return answer

    def _read(self, client, names: tuple[bytes, ...]) -> tuple[dict[bytes, bool], int]:
        """Which of `names` exist, and the revision that answer holds at."""
        if len(names) <= FEW_KEYS:
            responses = [client.get_response(n, keys_only=True) for n in names]
            self.rpcs += len(names)
            return {n: r.count > 0 for n, r in zip(names, responses)}, min(r.header.revision for r in responses)
        prefix = os.path.commonprefix(list(names))
        response = client.get_response(prefix, range_end=_range_end(prefix), keys_only=True)
        self.rpcs += 1
        found = {kv.key for kv in response.kvs}
        return {n: n in found for n in names}, response.header.revision

    def _watch(self, client, names: tuple[bytes, ...], present: dict[bytes, bool], revision: int) -> _Follow:
        events: queue.SimpleQueue = queue.SimpleQueue()
        f = _Follow(names, present, client, [], events)
        try:
            if len(names) <= FEW_KEYS:
                for n in names:
                    f.ids.append(client.add_watch_callback(n, events.put, start_revision=revision + 1))
            else:
                prefix = os.path.commonprefix(list(names))
                f.ids.append(client.add_watch_prefix_callback(prefix, events.put, start_revision=revision + 1))
        except Exception:
            _cancel(f)
            raise
        self.rpcs += len(f.ids)
        if self.lease:
            self.lease.waiting.add(events)
        return f

    def _drop_follow(self) -> None:
        f, self._follow = self._follow, None
        if f is not None:
            if self.lease:
                self.lease.waiting.discard(f.events)
            _cancel(f)


def _cancel(f: _Follow) -> None:
    for watch_id in f.ids:
        try:
            f.client.cancel_watch(watch_id)
        except Exception:
            pass  # the stream is gone already


def _name(key: str) -> bytes:
    return (ROOT + key).encode()


def _job(run_id: str) -> tuple[bytes, bytes]:
    job = f"{ROOT}{run_id}/".encode()
    return job, job + b"agents/"


def _range_end(prefix: bytes) -> bytes:
    from pyetcd.utils import prefix_range_end

    return prefix_range_end(prefix)


def _version(response) -> int:
    return response.kvs[0].version if response.count else 0


def _put_version(response) -> int:
    return response.prev_kv.version + 1 if response.HasField("prev_kv") else 1


def _chunks(items: list, size: int = TXN_OPS) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


# ---------------------------------------------------------------------------- the lease


class Lease:
    """This agent's lease and the keys on it, refreshed by a thread on a connection of its own."""

    def __init__(self, opts: EtcdOptions, ttl: int, interval: float):
        self.ttl, self.interval = ttl, interval
        # Short RPC deadline: a hung member must not outlast the TTL before we fail over.
        self.store = EtcdStore(opts, retry_for=ttl, client=_Client(opts, timeout=max(1.0, ttl / 2)))
        self.id = 0
        self.held: dict[bytes, bytes] = {}
        self.waiting: set[queue.SimpleQueue] = set()  # the event queues of this agent's open waits
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, via: EtcdStore, retry_for: float) -> None:
        """Grant the lease (through `via`, which retries up to `retry_for`) and start refreshing it."""
        self.id = via._call(lambda c: c.lease(self.ttl).id, retry_for=retry_for)
        self._thread = threading.Thread(target=self._run, name="launcher-etcd-lease", daemon=True)
        self._thread.start()

    def hold(self, name: bytes, value: bytes, via: EtcdStore, retry_for: float | None = None) -> None:
        """Put `name` on the lease (taking a new lease first if etcd forgot this one); kept across renewals."""
        for attempt in range(2):
            lease_id = self.id
            try:
                via._call(lambda c: c.put(name, value, lease=lease_id), retry_for=retry_for)
                break
            except _LeaseLost:
                if attempt:
                    raise RendezvousConnectionError("etcd keeps losing this agent's lease") from None
                self._renew(lease_id)
        self.held[name] = value

    def wake(self) -> None:
        """Make every wait of this agent return now (as at its timeout)."""
        for events in list(self.waiting):
            events.put(None)

    def revoke(self, via: EtcdStore) -> None:
        """Stop refreshing and give the lease back: every key on it vanishes at once."""
        self.close()
        try:
            via._call(lambda c: c.revoke_lease(self.id), retry_for=2.0)
        except (RendezvousError, _LeaseLost):
            pass  # it expires on its own

    def close(self) -> None:
        """Stop refreshing; the lease then expires within its TTL."""
        self._stop.set()
        if self._thread:
            self._thread.join(self.store.client.timeout + 1.0)
        self.store.close()

    def _run(self) -> None:
        lost_at: float | None = None
        told = False
        while not self._stop.wait(self.interval if lost_at is None else min(self.interval, 0.2)):
            try:
                ttl = self._refresh()
            except Exception as e:
                kind, why = _classify(e, self.store.opts)
                if kind == "reauth":
                    self.store.client.reset()
                lost_at = lost_at or time.monotonic()
                if not told and time.monotonic() - lost_at >= 1.0:
                    told = True
                    say(f"lost etcd at {self.store.opts.where} ({why}); the workers go on, retrying")
                continue
            if told:
                say(f"etcd is back after {time.monotonic() - (lost_at or 0):.1f} s")
            lost_at, told = None, False
            if ttl <= 0:
                say("etcd let this agent's lease expire; taking a new one")
                try:
                    self._renew(self.id)
                except Exception:
                    pass  # the next round of the loop tries again

    def _refresh(self) -> int:
        self.store.rpcs += 1
        responses = list(self.store.client.get().refresh_lease(self.id))
        return responses[0].TTL if responses else 0

    def _renew(self, stale: int) -> None:
        """A new lease with every held key on it (once, whichever thread notices first)."""
        with self._lock:
            if self.id != stale:
                return
            new = self.store._call(lambda c: c.lease(self.ttl).id)
            for name, value in list(self.held.items()):
                self.store._call(lambda c, n=name, v=value: c.put(n, v, lease=new))
            self.id = new


# ---------------------------------------------------------------------------- the backend


class EtcdRendezvous(ElasticRendezvous):
    """ElasticRendezvous on an etcd cluster: the agent signs in under the run id on its own lease."""

    def __init__(self, config: LaunchConfig, environ: Mapping[str, str] = os.environ):
        s = config.rdzv
        opts = options_from(config, environ)  # the workers never get the password: see env.AGENT_ONLY
        ttl = lease_ttl(s)
        lease = Lease(opts, ttl, min(s.keep_alive_interval, ttl / 3))
        store = EtcdStore(opts, lease, retry_for=s.read_timeout)
        node_id = f"{hostname()}:{os.getpid()}"
        try:
            store.register(config.run_id, node_id, retry_for=s.join_timeout)
        except BaseException:
            lease.close()
            store.close()
            raise
        host, port = opts.endpoints[0]
        addr = config.local_addr or outward_address(host, port)
        node = Node(
            node_id=node_id, addr=addr, ifname=interface_of(addr), nproc=config.nproc_per_node,
            min_nodes=config.min_nodes, max_nodes=config.max_nodes, max_restarts=config.max_restarts,
            token=config.join_token,
        )
        super().__init__(store, config.run_id, node, s, port_picker=free_port)

    def shutdown(self, succeeded: bool) -> None:
        """Leave the round, give the lease back; the last agent out deletes the run's keys."""
        self._stop_watch.set()
        self.store.lease.wake()  # the watcher leaves now, not at the end of its wait
        super().shutdown(succeeded)
        try:
            self.store.leave(self.run_id)
        except Exception:
            pass  # the lease expires on its own; the next run wipes what is left
        finally:
            self.store.close()
