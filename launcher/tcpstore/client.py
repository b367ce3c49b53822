"""The TCPStore client: one connection to a server (ours or torch's), thread-safe, every answer bounded in time.

Reconnecting (StoreClient with `reconnect`, on a version-2 server): a broken connection is opened
again in its session and SESSION_INFO must name the same boot id (else StoreRestarted: a new
process, its keys gone); the writes not yet confirmed by an answer are sent again, then the request
if it is safe to (StoreClient._call), all within `reconnect` seconds of the break.
"""

from __future__ import annotations

import logging
import os
import random
import select
import socket
import threading
import time
from collections.abc import Sequence

from ..net import lookup_form
from .wire import (
    ADD,
    ADD_ONCE,
    APPEND,
    CANCEL_WAIT,
    CHANGED,
    CHECK,
    COMPARE_SET,
    DELETE_KEY,
    END_SESSION,
    GET,
    GETNUMKEYS,
    GONE,
    HOLD,
    I64,
    MAGIC,
    MAX_REPLY,
    MULTI_GET,
    MULTI_SET,
    PING,
    READY,
    REFUSED,
    SESSION,
    SESSION_INFO,
    SET,
    STOP_WAITING,
    U8,
    U32,
    U64,
    VALIDATE,
    WAIT,
    WAIT_CANCELED,
    WAIT_CHANGE,
    close_socket,
    key_frame,
    keys_frame,
    str_frame,
)

log = logging.getLogger(__name__)

PROBES = 3  # hang-ups on SESSION in a row that tell torch's server (ours hangs up only when cut)
SAFE, ONCE, UNSAFE = 0, 1, 2  # may a request be sent again on a new connection: yes; while its session lives; no
MAX_UNCONFIRMED = 64  # writes kept for a resend; the next one is confirmed with a PING
# A connection still refused or unreachable is told after TELL_AFTER s (the retry that follows it,
# ~0.6 s in: within a second), then every TELL_EVERY s; a wait is never silent
TELL_AFTER, TELL_EVERY = 0.5, 10.0
QUICK_BREAK = 0.1  # a connection that breaks this soon after a request, 3 times in a row: the request is refused


class StoreError(Exception):
    """The store is gone, unreachable, or said something outside the protocol: the client is closed
    (but for a StoreTimeout)."""


class StoreTimeout(StoreError):
    """A key did not appear in time (the connection is fine)."""


class StoreRestarted(StoreError):
    """The client reached another server process than its session began on: the keys are gone."""


class StoreClient:
    """One connection to a TCPStore server (ours or torch's), thread-safe, every answer bounded in time.

    `timeout` bounds every answer and is the default wait; `connect_timeout` (default: `timeout`)
    is how long to keep retrying a refused connection, as torch's client does. With a `session` on
    our server (extension 2) and `reconnect` > 0, a connection that breaks (closed, reset, or no
    answer within `timeout`) is opened again in the same session for up to `reconnect` seconds, and
    what was sent is sent again where that is safe (see `_call`). `boot`: the server process the
    session began on (a sibling client's `boot`); a connection to another one raises StoreRestarted.
    """

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float = 300.0,
        connect_timeout: float | None = None,
        session: int | None = None,
        reconnect: float = 0.0,
        boot: int | None = None,
    ):
        self.host, self.port, self.timeout, self.reconnect = host, port, timeout, reconnect
        self._lock = threading.Lock()
        self._buf = bytearray()  # bytes received, not yet read
        self._broken = ""
        self._unconfirmed: list[bytes] = []  # writes sent since the last answer (an answer confirms those before it)
        self._next_id = random.getrandbits(64)  # ADD_ONCE's request ids
        self.session = session
        self.version = 0  # the server's extension; 0: none (torch's server) or no session asked
        self._legacy = False  # the server has no PING (torch 2.4): the handshake checks no keys instead
        connect_timeout = timeout if connect_timeout is None else connect_timeout
        # A sibling's connection (`boot` known): its store was up a moment ago, so a refusal says it is
        # gone, not that it is not up yet. Waiting out connect_timeout held a node's exit a minute where
        # the node hosting the store had just left (the watcher's or the leaving session's connection).
        gone_if_refused = boot is not None
        self._sock = self._connect(connect_timeout, gone_if_refused=gone_if_refused)
        found = None
        if session is not None:
            # torch's server hangs up on SESSION every time, ours only when the connection is cut at
            # that moment: a connection hung up on is opened again, and after PROBES hang-ups it
            # stays a plain one (torch's server).
            for attempt in range(1, PROBES + 1):
                try:
                    self.version, found = self._join_session(session)
                except (OSError, EOFError) as e:  # our server, cut off in the greeting: once more
                    close_socket(self._sock)
                    if attempt == PROBES:
                        raise StoreError(f"the store stopped answering its greeting ({_why(e)})") from None
                else:
                    if self.version:
                        break
                self._sock = self._connect(connect_timeout, gone_if_refused=gone_if_refused)
        if boot is not None and found != boot:
            close_socket(self._sock)
            raise StoreRestarted(f"{host}:{port} is not the store process this session began on")
        self.boot = found  # this server process's id (extension 2), None when it has none

    @property
    def busy(self) -> bool:
        """Another thread is in an exchange on this connection (it may be blocked in a wait)."""
        return self._lock.locked()

    @property
    def extended(self) -> bool:
        """The server has our extension ops and this connection joined `session`."""
        return self.version >= 1

    def _join_session(self, session: int) -> tuple[int, int | None]:
        """Ask for the extension: (the server's version, its boot id from version 2), or (0, None)
        when it hung up on SESSION (torch's server); OSError or EOFError when it did so after."""
        try:
            self._sock.sendall(U8.pack(SESSION) + U64.pack(session))
            version = U32.unpack(self._read(4))[0]
        except (OSError, EOFError):  # socket.timeout included: a server that ignores the op
            close_socket(self._sock)
            return 0, None
        if version < 2:
            return version, None
        self._sock.sendall(U8.pack(SESSION_INFO))
        boot = U64.unpack(self._read(8))[0]
        self._u8()  # resumed: a first connection's session is new, or a sibling's
        return version, boot

    def _connect(
        self,
        patience: float,
        extra: bytes = b"",
        bounded: bool = False,
        window: float | None = None,
        gone_if_refused: bool = False,
    ) -> socket.socket:
        """A connection that passed the handshake (VALIDATE, PING), with `extra` frames sent along;
        a refused or dropped one is retried for `patience` s, and said so (INFO) after TELL_AFTER s
        and every TELL_EVERY s. `bounded` (a reconnect): its answer too, and a refused one ends it.
        `window`: the time the error says was spent retrying (a reconnect's whole window, of which
        `patience` is what was left of it), else `patience`. `gone_if_refused`: a refused one ends it too.

        A server that hangs up on the PING (torch 2.4's, which has no such op) is greeted the old
        way from then on: VALIDATE, then a CHECK of no keys, which every server answers READY."""
        start = time.monotonic()
        deadline, delay, told = start + patience, 0.02, start + TELL_AFTER - TELL_EVERY
        nonce = os.getpid() & 0xFFFFFFFF
        why = ""
        address = (lookup_form(self.host), self.port)
        while True:
            left = deadline - time.monotonic()
            within = max(0.001, min(self.timeout, left)) if bounded else self.timeout
            try:
                sock = socket.create_connection(address, timeout=max(0.001, min(self.timeout, left)))
            except ConnectionRefusedError as e:
                # A reconnect or a sibling's connection: nothing listens, so the store is gone (a new one lost its keys)
                if bounded or gone_if_refused:
                    raise StoreError(f"{_why(e)}: no store listens there any more") from None
                why = _why(e)  # not up yet, maybe
            except OSError as e:  # unreachable
                why = _why(e)
            else:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    sock.settimeout(within)
                    probe = U8.pack(CHECK) + U64.pack(0) if self._legacy else U8.pack(PING) + U32.pack(nonce)
                    sock.sendall(U8.pack(VALIDATE) + U32.pack(MAGIC) + probe + extra)
                    self._sock = sock
                    self._buf.clear()
                    answer = self._u8() if self._legacy else U32.unpack(self._read(4))[0]
                    if answer == (READY if self._legacy else nonce):
                        return sock
                    close_socket(sock)
                    if answer != REFUSED:
                        raise StoreError(
                            "wrong answer to the handshake (another program on that port? "
                            "it does not speak the c10d store protocol)"
                        )
                    why = "the store is at its cap of connections and refused this one"
                except TimeoutError:
                    close_socket(sock)
                    if within >= self.timeout:
                        raise StoreError(
                            f"accepted the connection but never answered within {within:.3g} s "
                            "(another program on that port, or a frozen store?)"
                        ) from None
                    # cut short by the end of the reconnect window, not the store's silence: the last
                    # real reason stands
                    why = why or f"no answer within {within:.3g} s"
                except (OSError, EOFError) as e:  # closed or reset at once: torch's backlog full, or not a store
                    close_socket(sock)
                    self._buf.clear()
                    if isinstance(e, (EOFError, ConnectionResetError)) and not self._legacy and not bounded:
                        # hung up on PING (torch 2.4's servers: libuv closes, the legacy one resets):
                        # greeted the old way next, which every server answers
                        self._legacy = True
                        log.debug("the store at %s:%d hung up on PING: greeting it without", self.host, self.port)
                        continue
                    why = "it closed the connection" if isinstance(e, EOFError) else _why(e)
                    if not bounded:  # a reconnect: it was the store a moment ago
                        why += " (another program on that port? it does not speak the c10d store protocol)"
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                raise StoreError(f"{why}, retried for {window or patience:.3g} s")
            if not bounded and now - told >= TELL_EVERY:
                told = now
                log.info(
                    "cannot reach the store at %s:%d yet (%s); retrying for up to %.0f s more",
                    self.host,
                    self.port,
                    why,
                    left,
                )
            else:
                log.debug("connecting to the store at %s:%d: %s", self.host, self.port, why)
            if self._broken:  # closed by another thread while it reconnects
                raise StoreError(self._broken)
            time.sleep(min(delay, left))
            delay = min(2 * delay, 1.0)

    # -- the ops (keys are str, values bytes; `KEY_PREFIX` goes before every key on the wire)

    def set(self, key: str, value: bytes) -> None:
        self._call(U8.pack(SET) + key_frame(key) + str_frame(value), None)

    def get(self, key: str, wait: bool = True) -> bytes:
        """The value; with `wait`, first wait up to `timeout` for the key, as torch's client does
        (without it an absent key reads empty from torch's libuv server and ours, and closes the
        connection on its legacy server)."""
        if wait and not self.wait([key]):
            raise StoreTimeout(f"key {key!r} did not appear within {self.timeout:g} s")
        return self._call(U8.pack(GET) + key_frame(key), self._value)

    def add(self, key: str, delta: int) -> int:
        """Add `delta` to the number at `key`; the sum. Counted once even across a reconnect (ADD_ONCE),
        where the server has extension 2."""
        if delta and self.version >= 2:
            self._next_id = (self._next_id + 1) & 0xFFFFFFFFFFFFFFFF
            frame = U8.pack(ADD_ONCE) + key_frame(key) + I64.pack(delta) + U64.pack(self._next_id)
            return self._call(frame, self._i64, ONCE)
        return self._call(U8.pack(ADD) + key_frame(key) + I64.pack(delta), self._i64, UNSAFE if delta else SAFE)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """The value now; sent again after a reconnect, which is safe where values only move forward
        (create-if-absent, a round number that only grows), as the rendezvous protocol uses it."""
        return self._call(U8.pack(COMPARE_SET) + key_frame(key) + str_frame(expected) + str_frame(desired), self._value)

    def check(self, keys: Sequence[str]) -> bool:
        return self._call(U8.pack(CHECK) + keys_frame(keys), self._u8) == READY

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> bool:
        """True once every key exists, False when `timeout` (default: the client's) passes first."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)

        def answer() -> bool:
            got = self._waited(deadline - time.monotonic())
            if got is not None:
                self._expect(got, STOP_WAITING)
            return got is not None

        return self._call(U8.pack(WAIT) + keys_frame(keys), answer)

    def hold(self, key: str, value: bytes) -> None:
        """Set `key`, held by this client's session: the server deletes it once the session's last
        connection closed (and its grace passed). Needs `extended`."""
        self._extension()
        self._call(U8.pack(HOLD) + key_frame(key) + str_frame(value), lambda: self._expect(self._u8(), 0))

    def wait_change(self, change: str, alive: str | None, timeout: float | None = None) -> int | None:
        """CHANGED once `change` exists, GONE once `alive` is absent (never when None), None at the
        timeout. Needs `extended`."""
        self._extension()
        gone = key_frame(alive) if alive is not None else str_frame(b"")
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)

        def answer() -> int | None:
            got = self._waited(deadline - time.monotonic())
            if got is not None and got not in (CHANGED, GONE):
                raise StoreError(f"the store answered {got} to WAIT_CHANGE (outside the protocol)")
            return got

        return self._call(U8.pack(WAIT_CHANGE) + key_frame(change) + gone, answer)

    def _extension(self) -> None:
        if not self.extended:
            raise StoreError("this store server has no held keys (torch's own server): use heartbeats")

    def _waited(self, timeout: float) -> int | None:
        """The answer to a blocking op just sent, or None when `timeout` passed and CANCEL_WAIT took it back."""
        self._sock.settimeout(min(max(timeout, 0.001), 1e6))
        try:
            first = self._u8()
        except TimeoutError:  # nothing was read: the stream is still in step
            first = None
        finally:
            self._sock.settimeout(self.timeout)
        if first is None:
            self._sock.sendall(U8.pack(CANCEL_WAIT))
            first = self._u8()
            if first == WAIT_CANCELED:
                return None
            self._expect(self._u8(), WAIT_CANCELED)  # the answer came just before the cancel
        return first

    def multi_get(self, keys: Sequence[str], wait: bool = True) -> list[bytes]:
        """The values, in order; with `wait`, first wait for the keys as `get` does."""
        if wait and not self.wait(keys):
            raise StoreTimeout(f"keys did not appear within {self.timeout:g} s")
        return self._call(U8.pack(MULTI_GET) + keys_frame(keys), lambda: [self._value() for _ in keys])

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError("multi_set needs as many values as keys")
        body = b"".join(key_frame(k) + str_frame(v) for k, v in zip(keys, values))
        self._call(U8.pack(MULTI_SET) + U64.pack(len(keys)) + body, None)

    def delete_key(self, key: str) -> bool:
        """True when the key was there (after a reconnect it may read False though this call deleted it)."""
        return self._call(U8.pack(DELETE_KEY) + key_frame(key), self._i64) == 1

    def num_keys(self) -> int:
        return self._call(U8.pack(GETNUMKEYS), self._i64)

    def append(self, key: str, value: bytes) -> None:
        """Append to the value (never sent twice: a connection that breaks during it is an error)."""
        self._call(U8.pack(APPEND) + key_frame(key) + str_frame(value), None, UNSAFE)

    def end_session(self) -> bool:
        """End this connection's session now (the agent leaves): its held keys go, no lease (version 3);
        False where the server has no END_SESSION."""
        if self.version < 3:
            return False
        self._call(U8.pack(END_SESSION), self._u8)
        return True

    def close(self) -> None:
        """Close the connection; a call blocked on it in another thread fails at once."""
        self._broken = self._broken or "closed"
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # close() alone does not wake a blocked recv
        except OSError:
            pass
        close_socket(self._sock)

    # -- one exchange at a time; a broken connection is reopened (or the client closed)

    def _call(self, frame: bytes, answer, resend: int = SAFE):
        """Send `frame` and read its answer with `answer` (None: the op has none).

        Where the connection may reconnect (`reconnect`, extension 2), a break is survived for up
        to `reconnect` s: the writes sent since the last answer (they may be lost: an answer
        confirms everything before it on a connection) and then `frame` are sent again on a new
        connection of the session. `resend` says whether `frame` may be: SAFE (reads, waits,
        SET, HOLD, MULTI_SET, DELETE_KEY, COMPARE_SET as the protocol uses it); ONCE (ADD_ONCE: the
        server answers a request id it already counted with the first sum, while the session lives);
        UNSAFE (APPEND, a plain ADD: the break is an error, as without reconnecting). Before one of
        these goes, a connection found closed while idle is reopened: it is known not to have gone.
        """
        with self._lock:
            if self._broken:
                raise StoreError(self._broken)
            if answer is None and self._resumable():
                if resend == UNSAFE or len(self._unconfirmed) >= MAX_UNCONFIRMED:
                    frame += U8.pack(PING) + U32.pack(0x5EED)  # a write that must be known to have arrived
                    answer = lambda: self._expect(U32.unpack(self._read(4))[0], 0x5EED)  # noqa: E731
                else:
                    self._unconfirmed.append(frame)
            broke_at, sent_at, quick = None, time.monotonic(), 0
            if resend != SAFE and self._resumable() and self._closed_while_idle():  # reconnect before it is sent
                broke_at = sent_at
                self._reconnect("the store closed the connection while it was idle", sent_at, sent_at, False, SAFE)
            while True:
                try:
                    if broke_at is None:
                        self._sock.sendall(frame)
                    else:  # reconnected: what may have been lost, in order
                        self._sock.sendall(b"".join(self._unconfirmed) + (frame if answer else b""))
                    if answer is None:
                        return None
                    got = answer()
                    self._unconfirmed.clear()
                    return got
                except TimeoutError:
                    why, stuck = f"no answer within {self.timeout:g} s", True
                except EOFError:
                    why, stuck = "the store closed the connection", False
                except OSError as e:
                    why, stuck = _why(e), False
                except StoreError as e:  # outside the protocol: out of step for good
                    self._fail(str(e))
                now = time.monotonic()
                broke_at = now if broke_at is None else broke_at
                quick = quick + 1 if now - sent_at < QUICK_BREAK else 0
                if quick >= 3 and self._resumable():  # the store drops this very request (its server rejects it)
                    self._fail(f"{why}, each of the 3 times this request was sent")
                self._reconnect(why, broke_at, now, stuck, resend)
                sent_at = time.monotonic()

    def _resumable(self) -> bool:
        return self.reconnect > 0 and self.version >= 2

    def _closed_while_idle(self) -> bool:
        """Between exchanges nothing may arrive: a readable connection was closed or reset (or is out of step)."""
        poll = select.poll()  # not select.select: an agent among thousands of connections has descriptors past 1023
        poll.register(self._sock.fileno(), select.POLLIN)
        return bool(poll.poll(0))

    def _reconnect(self, why: str, since: float, now: float, stuck: bool, resend: int) -> None:
        """A new connection in the same session to the same server process, or StoreError; `since`:
        the call's first break (its time to reconnect runs from there), `now`: this one's.

        A connection that broke open (`stuck`: no answer, a freeze or a partition) is closed only
        once the new one joined, so the session is never without one; a closed one is gone already
        and the server keeps the session's held keys for its grace.
        """
        if self._broken or not self._resumable() or resend == UNSAFE:
            self._fail(self._broken or why)
        old = self._sock
        if not stuck:
            close_socket(old)
        left = since + self.reconnect - time.monotonic()
        try:
            if left <= 0:
                raise StoreError(f"still broken after {self.reconnect:g} s")
            session = U8.pack(SESSION) + U64.pack(self.session) + U8.pack(SESSION_INFO)
            self._connect(left, session, bounded=True, window=self.reconnect)
            try:
                version = U32.unpack(self._read(4))[0]
                boot = U64.unpack(self._read(8))[0] if version >= 2 else None
                resumed = boot is not None and self._u8() == 1
            except EOFError:  # it hung up on SESSION: a server without our extension
                boot = None
            self._sock.settimeout(self.timeout)
        except (StoreError, OSError, EOFError) as e:
            close_socket(old)
            if self._broken:
                raise StoreError(self._broken) from None
            # debug: the error raised says it, and its caller decides whether it matters (a store
            # that went away as the job ends is no news: issue 23 item 10)
            log.debug(
                "gave up reconnecting to the store at %s:%d after %.1f s: %s",
                self.host,
                self.port,
                time.monotonic() - now,
                _why(e),
            )
            self._fail(f"{why}; could not reconnect ({_why(e)})")
        close_socket(old)
        if boot != self.boot:
            self._broken = "the store restarted"
            close_socket(self._sock)
            raise StoreRestarted(f"{self.host}:{self.port} is a new store process: the keys written before are gone")
        if not resumed and resend == ONCE:
            self._fail(
                f"{why}; an add was in flight and the store had ended the session meanwhile, so it cannot tell "
                "whether it counted it: not sent again"
            )
        log.info(
            "reconnected to the store at %s:%d in %.3f s (%s)%s",
            self.host,
            self.port,
            time.monotonic() - now,
            why,
            "" if resumed else "; the store had ended its session meanwhile: the keys it held are gone",
        )

    def _fail(self, why: str):
        self._broken = why
        close_socket(self._sock)
        raise StoreError(why) from None

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self._sock.recv(max(n - len(self._buf), 1 << 16))
            if not chunk:
                raise EOFError
            self._buf += chunk
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def _u8(self) -> int:
        return self._read(1)[0]

    def _i64(self) -> int:
        return I64.unpack(self._read(8))[0]

    def _value(self) -> bytes:
        n = U64.unpack(self._read(8))[0]
        if n > MAX_REPLY:
            raise StoreError(f"the store sent a value of {n} bytes (over {MAX_REPLY})")
        return self._read(n)

    @staticmethod
    def _expect(got: int, want: int) -> None:
        if got != want:
            raise StoreError(f"the store answered {got}, not {want} (outside the protocol)")


def _why(e: BaseException) -> str:
    """An exception in a few words: its strerror, message, or type."""
    return getattr(e, "strerror", None) or str(e) or type(e).__name__
