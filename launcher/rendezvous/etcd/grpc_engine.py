"""etcd's v3 API over gRPC (etcd-sdk-python, module pyetcd): the backend's opt-in engine.

For where the JSON gateway refuses the client: etcd with --client-cert-auth and auth enabled
turns away every gateway request whose client certificate has a Common Name, while its gRPC API
serves it. Chosen with `--rdzv_conf engine=grpc`, installed with the `etcd-grpc`
extra (`launcher.install.command`); this module is imported only then, so grpc and protobuf stay out of every
other agent.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Sequence

from .engine import (
    ENDPOINT_RETRY_S,
    KV,
    Compare,
    Delete,
    EtcdError,
    EtcdOptions,
    Event,
    Get,
    Op,
    Put,
    classify,
    tls_failed,
)

# gRPC's reconnect backoff grows to 120 s by default: after an etcd restart we want it back at once.
GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def _import():
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


grpc, pyetcd = _import()
from pyetcd import etcdrpc  # noqa: E402  (after the quieted import)
from pyetcd import exceptions as pyetcd_errors  # noqa: E402


class Grpc:
    """The engine on etcd's gRPC API: one pyetcd client over every member, with failover, made
    on first use and made again when etcd forgot our auth token."""

    name = "grpc"

    def __init__(self, opts: EtcdOptions, timeout: float | None = None):
        self.opts = opts
        self.timeout = timeout or opts.timeout
        self._client = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ KV

    def range(self, key: bytes, range_end: bytes | None = None, *, keys_only: bool = False) -> tuple[list[KV], int]:
        r = self._rpc(
            lambda c: c.kvstub.Range(_range(Get(key, range_end, keys_only)), self.timeout, metadata=c.metadata)
        )
        return _kvs(r.kvs), r.header.revision

    def put(self, key: bytes, value: bytes, *, lease: int = 0, prev_kv: bool = False) -> KV | None:
        req = etcdrpc.PutRequest(key=key, value=value, lease=lease, prev_kv=prev_kv)
        r = self._rpc(lambda c: c.kvstub.Put(req, self.timeout, metadata=c.metadata))
        return _kv(r.prev_kv) if r.HasField("prev_kv") else None

    def txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> tuple[bool, list, int]:
        req = etcdrpc.TxnRequest(
            compare=[_compare(c) for c in compare], success=[_op(o) for o in success], failure=[_op(o) for o in failure]
        )
        r = self._rpc(lambda c: c.kvstub.Txn(req, self.timeout, metadata=c.metadata))
        results = [
            _kvs(x.response_range.kvs) if x.WhichOneof("response") == "response_range" else None for x in r.responses
        ]
        return r.succeeded, results, r.header.revision

    # ------------------------------------------------------------------ leases

    def lease_grant(self, ttl: int) -> int:
        return self._rpc(
            lambda c: c.leasestub.LeaseGrant(etcdrpc.LeaseGrantRequest(TTL=ttl), self.timeout, metadata=c.metadata)
        ).ID

    def lease_keepalive(self, lease_id: int) -> int:
        responses = self._rpc(lambda c: list(c.refresh_lease(lease_id)))
        return responses[0].TTL if responses else 0

    def lease_revoke(self, lease_id: int) -> None:
        self._rpc(
            lambda c: c.leasestub.LeaseRevoke(
                etcdrpc.LeaseRevokeRequest(ID=lease_id), self.timeout, metadata=c.metadata
            )
        )

    # ------------------------------------------------------------------ watches

    def watch(self, ranges: Sequence[tuple[bytes, bytes | None]]) -> GrpcWatch:
        def make(c) -> GrpcWatch:
            w = GrpcWatch(self, c)
            try:
                for key, end in ranges:
                    kw = {"range_end": end} if end is not None else {}
                    w.ids.append(c.add_watch_callback(key, w.events.put, **kw))
            except BaseException:
                w.close()
                raise
            return w

        return self._rpc(make)

    def close(self) -> None:
        self._reset()

    # ------------------------------------------------------------------ the client

    def _get(self):
        with self._lock:
            if self._client is None:
                self._client = _connect(self.opts, self.timeout)
            return self._client

    def _reset(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass

    def _rpc(self, fn):
        """fn(client), each failure turned into an EtcdError; one new login when etcd forgot our token."""
        for attempt in range(2):
            try:
                client = self._get()
                try:
                    return fn(client)
                except grpc.RpcError as e:
                    client._manage_grpc_errors(e)  # marks the member failed (failover), re-raises pyetcd's error
            except EtcdError:
                raise
            except Exception as e:
                err = self.error(e)
                if err.kind == "reauth":
                    self._reset()  # a new client logs in again
                    if not attempt:
                        continue
                    err = EtcdError("retry", err.why, unsent=True)
                raise err from None
        raise AssertionError("unreachable")

    def error(self, e: BaseException) -> EtcdError:
        """What an error from pyetcd or gRPC means."""
        rpc = e if isinstance(e, grpc.RpcError) else e.__context__  # pyetcd re-raises without the details
        if not (isinstance(rpc, grpc.RpcError) and hasattr(rpc, "code")):
            if isinstance(e, pyetcd_errors.NoServerAvailableError):
                return EtcdError("retry", "no endpoint answers", unsent=True)
            if isinstance(e, pyetcd_errors.Etcd3Exception):
                return EtcdError("retry", str(e) or type(e).__name__)
            return EtcdError("fatal", f"etcd client error: {type(e).__name__}: {e}")
        code, details = rpc.code(), rpc.details() or ""
        low = details.lower()
        # A refused certificate is fatal; a handshake cut short ("Endpoint closing") is an etcd restarting.
        if any(s in low for s in ("certificate", "unwrap failed", "tsi_data_corrupted", "ssl_error_ssl")):
            return tls_failed(self.opts, details)
        unsent = any(s in low for s in ("failed to connect", "connection refused", "no address"))
        return classify(code.value[0], details or code.name, self.opts, unsent=unsent)


class GrpcWatch:
    """pyetcd callback watches on the engine's client, their responses queued for the waiting thread."""

    def __init__(self, engine: Grpc, client):
        self.engine, self.client = engine, client
        self.ids: list = []
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.woken = False

    def next(self, deadline: float) -> list[Event] | None:
        try:
            item = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        if item is None or self.woken:
            return None
        if isinstance(item, Exception):
            raise self.engine.error(item)
        if self.engine._client is not self.client:
            raise EtcdError("retry", "the etcd client was made again")  # its watches went with the old one
        return [Event(ev.key, type(ev).__name__ == "PutEvent", ev.mod_revision, ev.value) for ev in item.events]

    def wake(self) -> None:
        self.woken = True
        self.events.put(None)

    def close(self) -> None:
        for watch_id in self.ids:
            try:
                self.client.cancel_watch(watch_id)
            except Exception:
                pass  # the stream is gone already


# ---------------------------------------------------------------------------- connecting


def _connect(opts: EtcdOptions, timeout: float):
    """A pyetcd client over every endpoint, with failover, logged in when a user is given."""
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


# ---------------------------------------------------------------------------- messages


def _range(g: Get):
    return etcdrpc.RangeRequest(key=g.key, range_end=g.range_end or b"", keys_only=g.keys_only, limit=g.limit)


def _op(op: Op):
    if isinstance(op, Get):
        return etcdrpc.RequestOp(request_range=_range(op))
    if isinstance(op, Put):
        return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=op.key, value=op.value, lease=op.lease))
    assert isinstance(op, Delete)
    return etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=op.key, range_end=op.range_end or b""))


def _compare(c: Compare):
    msg = etcdrpc.Compare(key=c.key, range_end=c.range_end or b"", result=etcdrpc.Compare.EQUAL)
    if c.target == "version":
        msg.target, msg.version = etcdrpc.Compare.VERSION, c.operand
    else:
        msg.target, msg.value = etcdrpc.Compare.VALUE, c.operand
    return msg


def _kv(kv) -> KV:
    return KV(kv.key, kv.value, kv.version, kv.lease)


def _kvs(kvs) -> list[KV]:
    return [_kv(kv) for kv in kvs]
