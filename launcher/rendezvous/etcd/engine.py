"""What the etcd backend asks of an etcd client ("engine"), the same over etcd's JSON gateway
(`gateway`) and its gRPC API (`grpc_engine`): a few KV, lease and watch calls, plain data in and
out, and one error type that already says what to do about a failure.

Both engines speak etcd's v3 API; they differ in transport only, so the errors etcd returns are
classified here once, from the gRPC status code and message both of them carry.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from .settings import ETCD_PASSWORD_ENV, ETCD_USER_ENV, EtcdOptions

ROOT = "/launcher/"
ENDPOINT_RETRY_S = 1.0  # a member that failed is tried again after this long (a restarted one comes back)


class KV(NamedTuple):
    """One key as etcd returned it (value empty when asked for keys only)."""

    key: bytes
    value: bytes
    version: int
    lease: int = 0


class Get(NamedTuple):
    """A range read, inside a txn: one key, or [key, range_end)."""

    key: bytes
    range_end: bytes | None = None
    keys_only: bool = False
    limit: int = 0  # at most this many keys (0: all)


class Put(NamedTuple):
    """A write, inside a txn."""

    key: bytes
    value: bytes
    lease: int = 0


class Delete(NamedTuple):
    """A delete of one key or of [key, range_end), inside a txn."""

    key: bytes
    range_end: bytes | None = None


class Compare(NamedTuple):
    """A txn guard: the key's (or, with range_end, every key's) `target` EQUALs `operand`."""

    key: bytes
    target: str  # "version" or "value"
    operand: int | bytes
    range_end: bytes | None = None


Op = Get | Put | Delete


class Event(NamedTuple):
    """One change a watch saw."""

    key: bytes
    put: bool  # False: a delete
    revision: int  # the revision it happened at
    value: bytes = b""  # a put's value


class ErrorKind(enum.StrEnum):
    """What a failed request means for the caller (a StrEnum: an engine may still pass the word)."""

    RETRY = "retry"  # etcd or the path to it is down or busy
    LEASE = "lease"  # etcd does not know the lease
    FATAL = "fatal"  # `why` is the user's one line
    REAUTH = "reauth"  # etcd refused our token; engines log in again and resend once, so it never reaches the store


class EtcdError(Exception):
    """A failed request, already judged (see `ErrorKind`). unsent: surely never applied."""

    def __init__(self, kind: ErrorKind | str, why: str, unsent: bool = False):
        super().__init__(why)
        self.kind, self.why, self.unsent = ErrorKind(kind), why, unsent


class Watch(Protocol):
    """Open watches on some keys or ranges, read by the thread that waits on them."""

    woken: bool  # `wake` was called: the watch is over

    def next(self, deadline: float) -> list[Event] | None:
        """The next events; None when `deadline` (time.monotonic) passed first or once woken."""

    def wake(self) -> None:
        """Make `next` return None now; callable from any thread."""

    def close(self) -> None:
        """Cancel the watches."""


class Engine(Protocol):
    """The etcd requests the backend sends; each raises EtcdError when it fails."""

    name: str

    def range(self, key: bytes, range_end: bytes | None = None, *, keys_only: bool = False) -> tuple[list[KV], int]:
        """The keys found and the revision the answer holds at."""

    def put(self, key: bytes, value: bytes, *, lease: int = 0, prev_kv: bool = False) -> KV | None:
        """Write; with prev_kv, the key as it was before (None if absent)."""

    def txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> tuple[bool, list, int]:
        """(whether every compare held, one result per op run: list[KV] for a Get, else None, revision)."""

    def lease_grant(self, ttl: int) -> int: ...
    def lease_keepalive(self, lease_id: int) -> int:
        """One refresh: the TTL left, 0 if etcd no longer knows the lease."""

    def lease_revoke(self, lease_id: int) -> None: ...

    def watch(self, ranges: Sequence[tuple[bytes, bytes | None]]) -> Watch:
        """Watch each (key, range_end or None) from etcd's current revision on; returns once etcd
        created every watch."""

    def close(self) -> None: ...


def range_end(prefix: bytes) -> bytes:
    """The end of the range of keys that start with `prefix`."""
    s = bytearray(prefix)
    for i in reversed(range(len(s))):
        if s[i] < 0xFF:
            s[i] += 1
            return bytes(s[: i + 1])
    return b"\0"  # every key


# gRPC status codes (both engines see them: the gateway passes the code in its JSON errors)
PERMISSION_DENIED, UNAUTHENTICATED = 7, 16
TRANSIENT = {
    1,
    2,
    4,
    8,
    10,
    13,
    14,
}  # CANCELLED UNKNOWN DEADLINE_EXCEEDED RESOURCE_EXHAUSTED ABORTED INTERNAL UNAVAILABLE


def classify(code: int, message: str, opts: EtcdOptions, *, unsent: bool = False) -> EtcdError:
    """What an error answer from etcd (gRPC status `code` and its message) means for us."""
    low = message.lower()
    if "authentication failed" in low:
        return EtcdError(
            ErrorKind.FATAL, f"etcd at {opts.where} rejected user {opts.user!r}: wrong user name or password"
        )
    if "invalid auth token" in low or code == UNAUTHENTICATED:
        # etcd restarted and forgot its tokens (or a token expired): the engine logs in again once
        return EtcdError(
            ErrorKind.REAUTH if opts.user else ErrorKind.FATAL, message if opts.user else needs_login(opts)
        )
    if "user name is empty" in low:  # no token sent: with a user given, auth was off at our login
        return EtcdError(
            ErrorKind.REAUTH if opts.user else ErrorKind.FATAL, message if opts.user else needs_login(opts)
        )
    if code == PERMISSION_DENIED or "permission denied" in low:
        who = f"user {opts.user!r}" if opts.user else "this client (no user given)"
        return EtcdError(
            ErrorKind.FATAL,
            f"etcd at {opts.where} denied {who} access to {ROOT} (permission denied); "
            "grant its role readwrite on that prefix",
        )
    if "requested lease not found" in low:
        return EtcdError(ErrorKind.LEASE, message)
    if code in TRANSIENT:
        return EtcdError(ErrorKind.RETRY, message or f"gRPC status {code}", unsent=unsent)
    return EtcdError(ErrorKind.FATAL, f"etcd at {opts.where} refused a request: {message or f'gRPC status {code}'}")


def needs_login(opts: EtcdOptions) -> str:
    return (
        f"etcd at {opts.where} requires a login: set {ETCD_USER_ENV} and {ETCD_PASSWORD_ENV} "
        f"(or --rdzv_conf user=NAME,password_file=PATH)"
    )


def tls_failed(opts: EtcdOptions, detail: str) -> EtcdError:
    return EtcdError(
        ErrorKind.FATAL, f"TLS with etcd at {opts.where} failed ({detail}); check --rdzv_conf cacert=, cert=, key="
    )
