"""etcd's v3 API through its JSON gateway, with the standard library only: the backend's default engine.

Every etcd since 3.4 serves the gateway (grpc-gateway) on its client port under /v3/; it is
etcd's documented HTTP API. What this relies on, checked against etcd 3.4.23:
- POST /v3/kv/range, kv/put, kv/txn, lease/grant, lease/revoke, auth/authenticate take the gRPC
  request as JSON (proto field names, bytes in base64, int64 as strings) and answer with JSON in
  which fields at their zero value (0, false, "", []) are left out.
- A refused request answers an HTTP error status and {"error", "message", "code": gRPC status}.
- lease/keepalive and watch are gRPC streams: the request body may hold several JSON messages
  (several watches on one stream), the answer is chunked, one {"result": ...} or {"error": ...}
  per line, and a watch stream stays open after the request body ended; closing the connection
  is the only way to cancel it.
- The auth token goes in the Authorization header. A header Grpc-Metadata-Hasleader: true reaches
  etcd as the gRPC metadata hasleader=true: a member cut off from its leader then refuses the
  request at once ("etcdserver: no leader") and cancels such watches, instead of answering from
  stale state and keeping watches silent.
- With --client-cert-auth and auth enabled, etcd answers every gateway request whose client
  certificate has a Common Name with HTTP 400, plain text "CommonName of client sending a request
  against gateway will be ignored and not used as expected": such a client must speak gRPC.
"""

from __future__ import annotations

import binascii
import json
import random
import threading
import time
from collections.abc import Sequence

from .engine import (
    ENDPOINT_RETRY_S,
    KV,
    Compare,
    ErrorKind,
    EtcdError,
    EtcdOptions,
    Event,
    Get,
    Op,
    Put,
    classify,
    tls_failed,
)
from .http1 import Closed, Connection

CONNECT_S = 2.0  # a member that does not accept within this is skipped for the next
MAX_IDLE = 64  # idle connections kept per member (an agent uses two or three)
COMMON_NAME_REFUSED = b"CommonName of client"


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return binascii.a2b_base64(text) if text else b""


class Session:
    """What one agent's gateway engines share: the TLS context, which members failed lately,
    idle keep-alive connections, and the login token."""

    def __init__(self, opts: EtcdOptions):
        self.opts = opts
        self.context = _tls_context(opts) if opts.tls else None
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, int], list[Connection]] = {ep: [] for ep in opts.endpoints}
        self._failed: dict[tuple[str, int], float] = {}
        self._current = random.choice(opts.endpoints)  # agents spread over the members
        self._login = threading.Lock()
        self.token: str | None = None
        self.auth_off = False  # etcd said auth is not enabled: the credentials are moot

    # ------------------------------------------------------------------ members

    def order(self) -> list[tuple[str, int]]:
        """Members to try: the one that answered last, the others, then those that failed lately."""
        now = time.monotonic()
        with self._lock:
            fresh = [ep for ep in self.opts.endpoints if now - self._failed.get(ep, -1e9) >= ENDPOINT_RETRY_S]
            stale = sorted((ep for ep in self.opts.endpoints if ep not in fresh), key=lambda ep: self._failed[ep])
            if self._current in fresh:
                fresh.remove(self._current)
                fresh.insert(0, self._current)
        return fresh + stale

    def failed(self, ep: tuple[str, int]) -> None:
        with self._lock:
            self._failed[ep] = time.monotonic()
            idle, self._idle[ep] = self._idle[ep], []
        for conn in idle:
            conn.close()

    def answered(self, ep: tuple[str, int]) -> None:
        with self._lock:
            self._current = ep
            self._failed.pop(ep, None)

    # ------------------------------------------------------------------ connections

    def checkout(self, ep: tuple[str, int], deadline: float) -> Connection:
        """An idle connection to `ep` that the server has not closed, or a new one."""
        while True:
            with self._lock:
                conn = self._idle[ep].pop() if self._idle[ep] else None
            if conn is None:
                break
            if conn.idle_and_open():
                return conn
            conn.close()
        timeout = max(0.01, min(CONNECT_S, deadline - time.monotonic()))
        return Connection(ep[0], ep[1], context=self.context, connect_timeout=timeout)

    def checkin(self, ep: tuple[str, int], conn: Connection) -> None:
        with self._lock:
            if len(self._idle[ep]) < MAX_IDLE:
                self._idle[ep].append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle = [c for conns in self._idle.values() for c in conns]
            for conns in self._idle.values():
                conns.clear()
        for conn in idle:
            conn.close()

    # ------------------------------------------------------------------ login

    def token_for(self, engine: Gateway) -> str | None:
        """The token to send: logs in first when a user is given and nobody has yet."""
        if not self.opts.user or self.auth_off:
            return None
        token = self.token
        if token is not None:
            return token
        with self._login:
            if self.token is None and not self.auth_off:
                doc = engine._post(
                    "/v3/auth/authenticate",
                    {"name": self.opts.user, "password": self.opts.password or ""},
                    token=None,
                    login=True,
                )
                if doc is None:
                    self.auth_off = True
                else:
                    self.token = str(doc.get("token") or "")
            return self.token

    def forget(self, token: str | None) -> None:
        """Drop a token etcd refused (once, whichever thread notices first); the next request logs in."""
        with self._login:
            if self.token == token:
                self.token = None
            self.auth_off = False


class Gateway:
    """The engine on etcd's JSON gateway: one request per call on a kept-alive connection, a
    member that does not answer skipped for ENDPOINT_RETRY_S, watches read by the waiting thread."""

    name = "gateway"

    def __init__(
        self,
        opts: EtcdOptions,
        timeout: float | None = None,
        session: Session | None = None,
        *,
        owner: bool | None = None,
    ):
        self.opts = opts
        self.timeout = timeout or opts.timeout
        self.session = session or Session(opts)
        self.owner = session is None if owner is None else owner  # closing closes the session's connections

    # ------------------------------------------------------------------ KV

    def range(self, key: bytes, range_end: bytes | None = None, *, keys_only: bool = False) -> tuple[list[KV], int]:
        doc = self._call("/v3/kv/range", _get(Get(key, range_end, keys_only)))
        return _kvs(doc.get("kvs")), _revision(doc)

    def put(self, key: bytes, value: bytes, *, lease: int = 0, prev_kv: bool = False) -> KV | None:
        doc = self._call("/v3/kv/put", {**_put(Put(key, value, lease)), **({"prev_kv": True} if prev_kv else {})})
        prev = doc.get("prev_kv")
        return _kv(prev) if prev else None

    def txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> tuple[bool, list, int]:
        doc = self._call(
            "/v3/kv/txn",
            {
                "compare": [_compare(c) for c in compare],
                "success": [_op(o) for o in success],
                "failure": [_op(o) for o in failure],
            },
        )
        results = []
        for r in doc.get("responses") or []:
            got = r.get("response_range")
            results.append(_kvs(got.get("kvs")) if got is not None else None)
        return bool(doc.get("succeeded")), results, _revision(doc)

    # ------------------------------------------------------------------ leases

    def lease_grant(self, ttl: int) -> int:
        doc = self._call("/v3/lease/grant", {"TTL": str(ttl)})
        if doc.get("error"):  # LeaseGrantResponse has an error field of its own
            raise classify(2, str(doc["error"]), self.opts)
        return int(doc["ID"])

    def lease_keepalive(self, lease_id: int) -> int:
        # A one-message stream: etcd answers the refresh, sees the request body end, ends the answer.
        doc = self._call("/v3/lease/keepalive", {"ID": str(lease_id)}, streamed=True)
        return int(doc.get("TTL") or 0)  # TTL left out: etcd does not know the lease

    def lease_revoke(self, lease_id: int) -> None:
        self._call("/v3/lease/revoke", {"ID": str(lease_id)})

    # ------------------------------------------------------------------ watches

    def watch(self, ranges: Sequence[tuple[bytes, bytes | None]]) -> GatewayWatch:
        """Every range on one stream (one connection), from now on; returns once etcd created them all."""
        creates = [
            json.dumps({"create_request": _span(key, end)}, separators=(",", ":")).encode() for key, end in ranges
        ]
        body = b"".join(creates)
        return self._logged_in(lambda token: self._open_watch(body, len(ranges), token))

    def _open_watch(self, body: bytes, count: int, token: str | None) -> GatewayWatch:
        deadline = time.monotonic() + self.timeout
        status, data, conn = self._exchange("/v3/watch", body, token, deadline, stream=True)
        if conn is None:
            raise self._error(status, data)
        watch = GatewayWatch(conn, self.opts)
        try:
            watch.created(count, deadline)  # a refused watch is canceled at once: say so here
        except BaseException:
            watch.close()
            raise
        return watch

    def close(self) -> None:
        if self.owner:
            self.session.close()

    # ------------------------------------------------------------------ requests

    def _call(self, path: str, payload: dict, *, streamed: bool = False) -> dict:
        """POST `payload`, logged in when a user is given; the answer's JSON (of a stream: its one result)."""
        return self._logged_in(lambda token: self._post(path, payload, token=token, streamed=streamed))

    def _logged_in(self, send):
        """send(token), logging in again and resending once when etcd refused the token (it forgets
        them when it restarts; they expire): the request was refused, not applied."""
        for attempt in (1, 2):
            token = self.session.token_for(self)
            try:
                return send(token)
            except EtcdError as e:
                if e.kind is not ErrorKind.REAUTH:
                    raise
                if attempt == 2:
                    raise EtcdError(ErrorKind.RETRY, e.why, unsent=True) from None
                self.session.forget(token)

    def _post(
        self, path: str, payload: dict, *, token: str | None, streamed: bool = False, login: bool = False
    ) -> dict | None:
        """One request; `streamed`: the answer is a stream of one message."""
        deadline = time.monotonic() + self.timeout
        body = json.dumps(payload, separators=(",", ":")).encode()
        status, data, _ = self._exchange(path, body, token, deadline)
        try:
            if status == 200:
                doc = json.loads(data.split(b"\n", 1)[0]) if streamed else json.loads(data)
                if streamed:
                    if "error" in doc:
                        raise _stream_error(doc["error"], self.opts)
                    doc = doc["result"]
                if not isinstance(doc, dict):
                    raise ValueError("not an object")
                return doc
        except (ValueError, KeyError, TypeError):
            raise self._not_gateway(status, data) from None
        error = self._error(status, data)
        if login and "authentication is not enabled" in error.why:
            return None
        if login and error.kind is ErrorKind.REAUTH:  # a login refused as such is a wrong password
            raise EtcdError(
                ErrorKind.FATAL,
                f"etcd at {self.opts.where} rejected user {self.opts.user!r}: wrong user name or password",
            )
        raise error

    def _exchange(self, path: str, body: bytes, token: str | None, deadline: float, *, stream: bool = False):
        """Send one request to the first member that takes it: (status, body, None), the connection
        back in the pool; with stream=True and status 200, (200, b"", the connection), the head read."""
        headers = {"Content-Type": "application/json", "Grpc-Metadata-Hasleader": "true"}
        if token:
            headers["Authorization"] = token
        last = "no member tried"
        s = self.session
        for ep in s.order():
            try:
                conn = s.checkout(ep, deadline)
            except OSError as e:  # refused, unreachable, timed out, TLS handshake: nothing was sent
                self._fatal_tls(e, ep, deadline)
                s.failed(ep)
                last = _describe(e)
                continue
            try:
                if stream:
                    conn.send(path, body, headers, deadline)
                    status, head = conn.head(deadline)
                    if status == 200:
                        s.answered(ep)
                        return status, b"", conn
                    data, keep = conn.read_body(head, deadline)
                else:
                    status, data, keep = conn.post(path, body, headers, deadline)
            except (OSError, Closed) as e:  # the request may have been applied
                conn.close()
                s.failed(ep)
                self._fatal_tls(e)
                raise EtcdError(ErrorKind.RETRY, _describe(e)) from None
            if keep:
                s.checkin(ep, conn)
            else:
                conn.close()
            if status == 503 and b"no leader" in data:  # refused before any work: another member may have one
                s.failed(ep)
                last = "etcdserver: no leader"
                continue
            s.answered(ep)
            return status, data, None
        raise EtcdError(ErrorKind.RETRY, last, unsent=True)

    def _error(self, status: int, data: bytes) -> EtcdError:
        if status == 400 and data.startswith(COMMON_NAME_REFUSED):
            from ...install import command

            return EtcdError(
                ErrorKind.FATAL,
                f"etcd at {self.opts.where} refuses JSON gateway requests from a client certificate "
                f"with a Common Name (--client-cert-auth with auth enabled): {command('etcd-grpc')} "
                f"and pass --rdzv_conf engine=grpc, or use a certificate "
                f"without a Common Name",
            )
        try:
            doc = json.loads(data)
            error = doc.get("error")
            if isinstance(error, dict):  # a stream's error
                return _stream_error(error, self.opts)
            if error is None and "message" not in doc:
                raise KeyError("error")
            # {"error", "message", "code"} (etcd 3.4, 3.5); newer grpc-gateways drop "error"
            return classify(int(doc.get("code") or 2), str(doc.get("message") or error), self.opts)
        except (ValueError, KeyError, TypeError, AttributeError):
            return self._not_gateway(status, data)

    def _not_gateway(self, status: int, data: bytes) -> EtcdError:
        if status == 404:
            return EtcdError(
                ErrorKind.FATAL,
                f"etcd at {self.opts.where} has no v3 JSON gateway at /v3/ (HTTP 404): etcd 3.4 or later is needed",
            )
        if status >= 500:
            return EtcdError(ErrorKind.RETRY, f"HTTP {status} from etcd")
        return EtcdError(
            ErrorKind.FATAL,
            f"etcd at {self.opts.where} gave an answer that is not etcd's: HTTP {status} {data[:120]!r}",
        )

    def _fatal_tls(self, e: BaseException, ep: tuple[str, int] | None = None, deadline: float = 0.0) -> None:
        """Raise the user's one line for a TLS failure that no retry can mend (`ep`: in its handshake)."""
        if self.session.context is None:
            return
        import ssl

        if isinstance(e, ssl.SSLCertVerificationError):
            raise tls_failed(self.opts, e.verify_message or str(e)) from None
        if not isinstance(e, ssl.SSLError):
            return
        plain = "WRONG_VERSION_NUMBER" in str(e)
        if isinstance(e, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
            # etcd's plain port hangs up on a TLS hello, as a member going away would: ask it in plain HTTP.
            plain = ep is not None and _answers_plain_http(ep, deadline)
            if not plain:
                return  # retried
        if plain:
            where = f"{ep[0]}:{ep[1]}" if ep else self.opts.where
            raise EtcdError(
                ErrorKind.FATAL,
                f"etcd at {where} does not speak TLS (it answers plain HTTP); "
                f"use http:// endpoints without cacert=, cert=, key=",
            ) from None
        detail = str(getattr(e, "reason", None) or e).replace("_", " ").lower()
        if "alert" in detail and "certificate" in detail and not self.opts.cert:
            detail += ": etcd wants a client certificate"
        raise tls_failed(self.opts, detail) from None


class GatewayWatch:
    """One watch stream: read by the waiting thread up to its deadline, ended by closing it."""

    def __init__(self, conn: Connection, opts: EtcdOptions):
        self.conn, self.opts = conn, opts
        self.woken = False
        self._early: list[Event] = []  # events read while waiting for the creations

    def created(self, count: int, deadline: float) -> None:
        """Read until etcd confirmed `count` creations (events meanwhile are kept for `next`)."""
        while count:
            line = self._line(deadline)
            if line is None:
                raise EtcdError(ErrorKind.RETRY, "etcd did not create the watch in time")
            made, events = _watch_message(line, self.opts)
            count -= made
            self._early += events

    def next(self, deadline: float) -> list[Event] | None:
        if self._early:
            events, self._early = self._early, []
            return events
        while not self.woken:
            line = self._line(deadline)
            if line is None or self.woken:
                return None
            _, events = _watch_message(line, self.opts)
            if events:
                return events
        return None

    def wake(self) -> None:
        self.woken = True
        self.conn.abort()

    def close(self) -> None:
        self.conn.close()

    def _line(self, deadline: float) -> bytes | None:
        while True:
            try:
                line = self.conn.line(deadline)
            except (OSError, Closed) as e:
                if self.woken:
                    return None
                raise EtcdError(ErrorKind.RETRY, f"watch stream: {_describe(e)}") from None
            if line is None or line.strip():
                return line


def _watch_message(line: bytes, opts: EtcdOptions) -> tuple[int, list[Event]]:
    """(1 if it confirms a creation else 0, its events) from one line of a watch stream."""
    try:
        doc = json.loads(line)
        if "error" in doc:
            raise _stream_error(doc["error"], opts)
        result = doc["result"]
        if result.get("canceled"):
            if result.get("compact_revision"):
                raise EtcdError(ErrorKind.RETRY, "the watched revision was compacted")
            # A watch refused at creation says why in words only, e.g. "rpc error: code =
            # Unauthenticated desc = etcdserver: invalid auth token" after an etcd restart.
            raise classify(2, str(result.get("cancel_reason") or "watch canceled"), opts)
        events = [
            Event(
                _unb64(ev["kv"]["key"]),
                ev.get("type", "PUT") != "DELETE",
                int(ev["kv"].get("mod_revision") or 0),
                _unb64(ev["kv"].get("value")),
            )
            for ev in result.get("events") or []
        ]
        return (1 if result.get("created") else 0), events
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        raise EtcdError(
            ErrorKind.FATAL, f"etcd at {opts.where} sent a watch message that is not etcd's: {line[:120]!r}"
        ) from None


def _stream_error(error, opts: EtcdOptions) -> EtcdError:
    """A stream's {"error": {"grpc_code" (or "code"), "message", ...}}."""
    if isinstance(error, dict):
        return classify(int(error.get("grpc_code") or error.get("code") or 2), str(error.get("message") or ""), opts)
    return classify(2, str(error), opts)


# ---------------------------------------------------------------------------- JSON shapes


def _span(key: bytes, end: bytes | None) -> dict:
    """One key, or the keys in [key, end)."""
    return {"key": _b64(key)} if end is None else {"key": _b64(key), "range_end": _b64(end)}


def _get(g: Get) -> dict:
    req = _span(g.key, g.range_end)
    if g.keys_only:
        req["keys_only"] = True
    if g.limit:
        req["limit"] = str(g.limit)
    return req


def _put(p: Put) -> dict:
    req = {"key": _b64(p.key), "value": _b64(p.value)}
    if p.lease:
        req["lease"] = str(p.lease)
    return req


def _op(op: Op) -> dict:
    if isinstance(op, Get):
        return {"request_range": _get(op)}
    if isinstance(op, Put):
        return {"request_put": _put(op)}
    return {"request_delete_range": _span(op.key, op.range_end)}


def _compare(c: Compare) -> dict:
    out = {"result": "EQUAL", "target": c.target.upper(), **_span(c.key, c.range_end)}
    out[c.target] = str(c.operand) if c.target == "version" else _b64(c.operand)
    return out


def _kv(kv: dict) -> KV:
    return KV(_unb64(kv.get("key")), _unb64(kv.get("value")), int(kv.get("version") or 0), int(kv.get("lease") or 0))


def _kvs(kvs) -> list[KV]:
    return [_kv(kv) for kv in kvs or []]


def _revision(doc: dict) -> int:
    return int((doc.get("header") or {}).get("revision") or 0)


def _describe(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, TimeoutError):
        return "timed out"
    if isinstance(e, Closed):
        return str(e)
    return f"{e.strerror or e}" if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__


def _answers_plain_http(ep: tuple[str, int], deadline: float) -> bool:
    """Whether `ep` answers a plain HTTP request (GET /version)."""
    try:
        conn = Connection(ep[0], ep[1], connect_timeout=max(0.1, min(CONNECT_S, deadline - time.monotonic())))
    except OSError:
        return False
    try:
        conn.send("/version", b"", {}, max(deadline, time.monotonic() + 1.0), method="GET")
        conn.head(max(deadline, time.monotonic() + 1.0))
        return True
    except (OSError, Closed):
        return False
    finally:
        conn.close()


def _tls_context(opts: EtcdOptions):
    """Our own context: it trusts `cacert` alone when given (no environment variable overrides that)."""
    import ssl

    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the certificate and the host name
        if opts.cacert:
            context.load_verify_locations(cafile=opts.cacert)
        else:
            context.load_default_certs()
        if opts.cert:
            context.load_cert_chain(opts.cert, opts.key)
    except (OSError, ValueError) as e:
        raise EtcdError(
            ErrorKind.FATAL, f"cannot load the TLS files for etcd ({e}); check --rdzv_conf cacert=, cert=, key="
        ) from None
    return context
