"""torch's TCPStore wire protocol in pure Python: a client and a one-thread server, standard library only.

Wire-compatible with `torch.distributed.TCPStore` (checked against torch 2.13, both its libuv and
its legacy server): torch's client works against `StoreServer`, and `StoreClient` against torch's
server. It lets the agent meet the other nodes without importing torch.

Framing. Every integer is little-endian (torch writes its native byte order; x86 and ARM alike):
    request = op:u8 then the op's fields, back to back, no length prefix for the whole frame
    str     = len:u64 then len bytes              (keys and values alike)
    strs    = count:u64 then count x str
A connection begins with VALIDATE; torch's client then sends PING and checks the nonce comes back.
Its client puts "/" before every key (KEY_PREFIX), and so does ours: both see the same keys.

Ops (request fields -> reply; "-" is no reply):
    0  VALIDATE     magic:u32                -> -      the first frame; anything else closes the connection
    1  SET          key value                -> -
    2  COMPARE_SET  key expected desired     -> str    the value now (see StoreServer._compare_set)
    3  GET          key                      -> str    empty when absent (torch's client waits first)
    4  ADD          key delta:i64            -> i64    the sum, stored as decimal text
    5  CHECK        strs                     -> u8     0 every key exists, 1 not
    6  WAIT         strs                     -> u8     0 once every key exists, however much later
    7  GETNUMKEYS   -                        -> i64
    8  DELETE_KEY   key                      -> i64    keys deleted, 0 or 1
    9  APPEND       key value                -> -
    10 MULTI_GET    strs                     -> str per key
    11 MULTI_SET    count:u64 (key value)*   -> -
    12 CANCEL_WAIT  -                        -> u8     1; a WAIT's 0 may come just before it
    13 PING         nonce:u32                -> u32    the same nonce
    14 QUEUE_PUSH   key value                -> -
    15 QUEUE_POP    key                      -> i64 length, then str when length > 0
    16 QUEUE_LEN    key                      -> i64
    17 LIST_KEYS    -                        -> i64 count, then count x str
    18 BARRIER      key world:i64            -> u8     0 once `world` clients arrived at `key`
Extension ops (ours; torch's servers drop a connection that sends them, which is how a client tells, after PROBES in a row):
    200 SESSION      session:u64             -> u32    EXT_VERSION (2); this connection belongs to `session`
    201 HOLD         key value               -> u8     0: SET, and the key is held by the connection's session
    202 WAIT_CHANGE  change alive            -> u8     0 once `change` exists, 2 once `alive` is absent
                                                       (alive empty: never); CANCEL_WAIT ends it as a WAIT
    203 SESSION_INFO -                       -> u64 boot, u8 resumed   (version 2) boot: this server process's
                                                       random id; resumed: 1 when SESSION found the session live
    204 ADD_ONCE     key delta:i64 id:u64    -> i64    (version 2) ADD, counted once per `id` in the session:
                                                       sent again, it answers the first sum and adds nothing
A held key lives while any connection of its session is open, and GRACE (0.1 s) after the last
one closed: an agent that died (the kernel closes its sockets at once) loses its keys then, and
its WAIT_CHANGEs wake; a connection of the session that comes back within the grace deletes
nothing. An agent's connections share one session, so one of them closing deletes nothing.
A version-1 client reads SESSION's answer and never sends 203 or 204; a version-2 client on a
version-1 server uses neither, and does not reconnect (it could not tell a restarted server).

Reconnecting (StoreClient with `reconnect`, on a version-2 server): a broken connection is opened
again in its session and SESSION_INFO must name the same boot id (else StoreRestarted: a new
process, its keys gone); the writes not yet confirmed by an answer are sent again, then the request
if it is safe to (StoreClient._call), all within `reconnect` seconds of the break.

Limits are torch's libuv server's (a key <= 8 KiB, a value <= 8 MiB, <= 128 Ki keys a frame) plus
one of ours: no request or reply frame over 64 MiB. A frame past them closes that connection only.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import select
import selectors
import socket
import struct
import threading
import time
from collections.abc import Sequence

log = logging.getLogger(__name__)

(
    VALIDATE,
    SET,
    COMPARE_SET,
    GET,
    ADD,
    CHECK,
    WAIT,
    GETNUMKEYS,
    DELETE_KEY,
    APPEND,
    MULTI_GET,
    MULTI_SET,
    CANCEL_WAIT,
    PING,
    QUEUE_PUSH,
    QUEUE_POP,
    QUEUE_LEN,
    LIST_KEYS,
    BARRIER,
) = range(19)
SESSION, HOLD, WAIT_CHANGE, SESSION_INFO, ADD_ONCE = 200, 201, 202, 203, 204  # our extension (see the table above)
EXT_VERSION = 2
CHANGED, GONE = 0, 2  # WAIT_CHANGE's answers (1 is WAIT_CANCELED, as for WAIT)
MAGIC = 0x3C85F7CE  # VALIDATE's number: tells a store client from a stray connection
READY, NOT_READY = 0, 1  # CHECK's answer
STOP_WAITING, WAIT_CANCELED = 0, 1  # WAIT's (and BARRIER's) answer, then CANCEL_WAIT's
KEY_PREFIX = b"/"

MAX_KEY = 8 << 10
MAX_VALUE = 8 << 20
MAX_KEYS = 128 << 10
MAX_FRAME = 64 << 20

U8, U32, I64, U64 = (struct.Struct(f) for f in ("<B", "<I", "<q", "<Q"))

# Each op's request fields: k key, v value, q i64, Q u64, I u32, K strs of keys, P count and key/value pairs.
REQUEST = {
    VALIDATE: "I",
    SET: "kv",
    COMPARE_SET: "kvv",
    GET: "k",
    ADD: "kq",
    CHECK: "K",
    WAIT: "K",
    GETNUMKEYS: "",
    DELETE_KEY: "k",
    APPEND: "kv",
    MULTI_GET: "K",
    MULTI_SET: "P",
    CANCEL_WAIT: "",
    PING: "I",
    QUEUE_PUSH: "kv",
    QUEUE_POP: "k",
    QUEUE_LEN: "k",
    LIST_KEYS: "",
    BARRIER: "kq",
    SESSION: "Q",
    HOLD: "kv",
    WAIT_CHANGE: "kk",
    SESSION_INFO: "",
    ADD_ONCE: "kqQ",
}

PROBES = 3  # hang-ups on SESSION in a row that tell torch's server (ours hangs up only when cut)
GRACE = 0.1  # seconds a session's held keys outlive its last connection: a reconnect within it deletes nothing
ADDS_KEPT = 64  # ADD_ONCE answers a session keeps for resends (a client has one request out at a time)
SAFE, ONCE, UNSAFE = 0, 1, 2  # may a request be sent again on a new connection: yes; while its session lives; no
MAX_UNCONFIRMED = 64  # writes kept for a resend; the next one is confirmed with a PING
QUICK_BREAK = 0.1  # a connection that breaks this soon after a request, 3 times in a row: the request is refused


class StoreError(Exception):
    """The store is gone, unreachable, or said something outside the protocol: the client is closed
    (but for a StoreTimeout)."""


class StoreTimeout(StoreError):
    """A key did not appear in time (the connection is fine)."""


class StoreRestarted(StoreError):
    """The client reached another server process than its session began on: the keys are gone."""


def _str(data: bytes) -> bytes:
    return U64.pack(len(data)) + data


def _strs(items: Sequence[bytes]) -> bytes:
    return U64.pack(len(items)) + b"".join(U64.pack(len(b)) + b for b in items)


# ---------------------------------------------------------------------------------------------- client


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
        connect_timeout = timeout if connect_timeout is None else connect_timeout
        self._sock = self._connect(connect_timeout)
        found = None
        if session is not None:
            # torch's server hangs up on SESSION every time, ours only when the connection is cut at
            # that moment: a connection hung up on is opened again, and after PROBES hang-ups it
            # stays a plain one (torch's server).
            for attempt in range(1, PROBES + 1):
                try:
                    self.version, found = self._join_session(session)
                except (OSError, EOFError) as e:  # our server, cut off in the greeting: once more
                    _close(self._sock)
                    if attempt == PROBES:
                        raise StoreError(f"the store stopped answering its greeting ({_why(e)})") from None
                else:
                    if self.version:
                        break
                self._sock = self._connect(connect_timeout)
        if boot is not None and found != boot:
            _close(self._sock)
            raise StoreRestarted(f"{host}:{port} is not the store process this session began on")
        self.boot = found  # this server process's id (extension 2), None when it has none

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
            _close(self._sock)
            return 0, None
        if version < 2:
            return version, None
        self._sock.sendall(U8.pack(SESSION_INFO))
        boot = U64.unpack(self._read(8))[0]
        self._u8()  # resumed: a first connection's session is new, or a sibling's
        return version, boot

    def _connect(self, patience: float, extra: bytes = b"", bounded: bool = False) -> socket.socket:
        """A connection that passed the handshake (VALIDATE, PING), with `extra` frames sent along;
        a refused or dropped one is retried for `patience` s. `bounded` (a reconnect): its answer
        too, and a refused one ends it."""
        deadline, delay = time.monotonic() + patience, 0.02
        nonce = os.getpid() & 0xFFFFFFFF
        while True:
            left = deadline - time.monotonic()
            within = max(0.001, min(self.timeout, left)) if bounded else self.timeout
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(0.001, min(self.timeout, left)))
            except ConnectionRefusedError as e:
                if bounded:  # nothing listens: the store is gone, and a new one would have lost its keys
                    raise StoreError(f"{_why(e)}: no store listens there any more") from None
                why = _why(e)  # not up yet, maybe
            except OSError as e:  # unreachable
                why = _why(e)
            else:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    sock.settimeout(within)
                    sock.sendall(U8.pack(VALIDATE) + U32.pack(MAGIC) + U8.pack(PING) + U32.pack(nonce) + extra)
                    self._sock = sock
                    self._buf.clear()
                    if U32.unpack(self._read(4))[0] == nonce:
                        return sock
                    _close(sock)
                    raise StoreError(
                        "wrong answer to the handshake (another program on that port? "
                        "it does not speak the c10d store protocol)"
                    )
                except TimeoutError:
                    _close(sock)
                    raise StoreError(
                        f"accepted the connection but never answered within {within:.3g} s "
                        "(another program on that port, or a frozen store?)"
                    ) from None
                except (OSError, EOFError) as e:  # closed or reset at once: torch's backlog full, or not a store
                    _close(sock)
                    self._buf.clear()
                    why = "it closed the connection" if isinstance(e, EOFError) else _why(e)
                    if not bounded:  # a reconnect: it was the store a moment ago
                        why += " (another program on that port? it does not speak the c10d store protocol)"
            log.debug("connecting to the store at %s:%d: %s", self.host, self.port, why)
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreError(f"{why}, retried for {patience:.3g} s")
            if self._broken:  # closed by another thread while it reconnects
                raise StoreError(self._broken)
            time.sleep(min(delay, left))
            delay = min(2 * delay, 1.0)

    # -- the ops (keys are str, values bytes; `KEY_PREFIX` goes before every key on the wire)

    def set(self, key: str, value: bytes) -> None:
        self._call(U8.pack(SET) + _key(key) + _str(value), None)

    def get(self, key: str, wait: bool = True) -> bytes:
        """The value; with `wait`, first wait up to `timeout` for the key, as torch's client does
        (without it an absent key reads empty from torch's libuv server and ours, and closes the
        connection on its legacy server)."""
        if wait and not self.wait([key]):
            raise StoreTimeout(f"key {key!r} did not appear within {self.timeout:g} s")
        return self._call(U8.pack(GET) + _key(key), self._value)

    def add(self, key: str, delta: int) -> int:
        """Add `delta` to the number at `key`; the sum. Counted once even across a reconnect (ADD_ONCE),
        where the server has extension 2."""
        if delta and self.version >= 2:
            self._next_id = (self._next_id + 1) & 0xFFFFFFFFFFFFFFFF
            frame = U8.pack(ADD_ONCE) + _key(key) + I64.pack(delta) + U64.pack(self._next_id)
            return self._call(frame, self._i64, ONCE)
        return self._call(U8.pack(ADD) + _key(key) + I64.pack(delta), self._i64, UNSAFE if delta else SAFE)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """The value now; sent again after a reconnect, which is safe where values only move forward
        (create-if-absent, a round number that only grows), as the rendezvous protocol uses it."""
        return self._call(U8.pack(COMPARE_SET) + _key(key) + _str(expected) + _str(desired), self._value)

    def check(self, keys: Sequence[str]) -> bool:
        return self._call(U8.pack(CHECK) + _keys(keys), self._u8) == READY

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> bool:
        """True once every key exists, False when `timeout` (default: the client's) passes first."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)

        def answer() -> bool:
            got = self._waited(deadline - time.monotonic())
            if got is not None:
                self._expect(got, STOP_WAITING)
            return got is not None

        return self._call(U8.pack(WAIT) + _keys(keys), answer)

    def hold(self, key: str, value: bytes) -> None:
        """Set `key`, held by this client's session: the server deletes it once the session's last
        connection closed (and its grace passed). Needs `extended`."""
        self._extension()
        self._call(U8.pack(HOLD) + _key(key) + _str(value), lambda: self._expect(self._u8(), 0))

    def wait_change(self, change: str, alive: str | None, timeout: float | None = None) -> int | None:
        """CHANGED once `change` exists, GONE once `alive` is absent (never when None), None at the
        timeout. Needs `extended`."""
        self._extension()
        gone = _key(alive) if alive is not None else _str(b"")
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)

        def answer() -> int | None:
            got = self._waited(deadline - time.monotonic())
            if got is not None and got not in (CHANGED, GONE):
                raise StoreError(f"the store answered {got} to WAIT_CHANGE (outside the protocol)")
            return got

        return self._call(U8.pack(WAIT_CHANGE) + _key(change) + gone, answer)

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
        return self._call(U8.pack(MULTI_GET) + _keys(keys), lambda: [self._value() for _ in keys])

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError("multi_set needs as many values as keys")
        body = b"".join(_key(k) + _str(v) for k, v in zip(keys, values))
        self._call(U8.pack(MULTI_SET) + U64.pack(len(keys)) + body, None)

    def delete_key(self, key: str) -> bool:
        """True when the key was there (after a reconnect it may read False though this call deleted it)."""
        return self._call(U8.pack(DELETE_KEY) + _key(key), self._i64) == 1

    def num_keys(self) -> int:
        return self._call(U8.pack(GETNUMKEYS), self._i64)

    def append(self, key: str, value: bytes) -> None:
        """Append to the value (never sent twice: a connection that breaks during it is an error)."""
        self._call(U8.pack(APPEND) + _key(key) + _str(value), None, UNSAFE)

    def close(self) -> None:
        """Close the connection; a call blocked on it in another thread fails at once."""
        self._broken = self._broken or "closed"
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # close() alone does not wake a blocked recv
        except OSError:
            pass
        _close(self._sock)

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
            _close(old)
        left = since + self.reconnect - time.monotonic()
        try:
            if left <= 0:
                raise StoreError(f"still broken after {self.reconnect:g} s")
            self._connect(left, U8.pack(SESSION) + U64.pack(self.session) + U8.pack(SESSION_INFO), bounded=True)
            try:
                version = U32.unpack(self._read(4))[0]
                boot = U64.unpack(self._read(8))[0] if version >= 2 else None
                resumed = boot is not None and self._u8() == 1
            except EOFError:  # it hung up on SESSION: a server without our extension
                boot = None
            self._sock.settimeout(self.timeout)
        except (StoreError, OSError, EOFError) as e:
            _close(old)
            if self._broken:
                raise StoreError(self._broken) from None
            log.info(
                "gave up reconnecting to the store at %s:%d after %.1f s: %s",
                self.host,
                self.port,
                time.monotonic() - now,
                _why(e),
            )
            self._fail(f"{why}; could not reconnect ({_why(e)})")
        _close(old)
        if boot != self.boot:
            self._broken = "the store restarted"
            _close(self._sock)
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
        _close(self._sock)
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
        if n > MAX_FRAME:
            raise StoreError(f"the store sent a value of {n} bytes (over {MAX_FRAME})")
        return self._read(n)

    @staticmethod
    def _expect(got: int, want: int) -> None:
        if got != want:
            raise StoreError(f"the store answered {got}, not {want} (outside the protocol)")


def _why(e: BaseException) -> str:
    """An exception in a few words: its strerror, message, or type."""
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _key(key: str) -> bytes:
    return _str(KEY_PREFIX + key.encode())


def _keys(keys: Sequence[str]) -> bytes:
    return _strs([KEY_PREFIX + k.encode() for k in keys])


def _close(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------- server


class _Incomplete(Exception):
    """The frame needs more bytes than have arrived: `need` bytes from its start, at least."""

    def __init__(self, need: int):
        self.need = need


class _Malformed(Exception):
    """A frame outside the protocol or its limits: its connection is closed."""


def parse(buf: bytearray, pos: int) -> tuple[int, list, int]:
    """The frame at buf[pos:] -> (op, its fields, where it ends); raises _Incomplete or _Malformed."""
    end = len(buf)

    def take(n: int) -> int:
        nonlocal pos
        start, pos = pos, pos + n
        if pos > end:
            raise _Incomplete(pos)
        return start

    def count(cap: int, what: str) -> int:
        n = U64.unpack_from(buf, take(8))[0]
        if n > cap:
            raise _Malformed(f"{what} of {n} (over {cap})")
        return n

    def blob(cap: int, what: str) -> bytes:
        n = count(cap, what)
        at = take(n)
        return bytes(buf[at : at + n])

    op = buf[take(1)]
    shape = REQUEST.get(op)
    if shape is None:
        raise _Malformed(f"unknown op {op}")
    fields: list = []
    for f in shape:
        if f == "k":
            fields.append(blob(MAX_KEY, "a key"))
        elif f == "v":
            fields.append(blob(MAX_VALUE, "a value"))
        elif f == "q":
            fields.append(I64.unpack_from(buf, take(8))[0])
        elif f == "I":
            fields.append(U32.unpack_from(buf, take(4))[0])
        elif f == "Q":
            fields.append(U64.unpack_from(buf, take(8))[0])
        elif f == "K":
            fields.append([blob(MAX_KEY, "a key") for _ in range(count(MAX_KEYS, "a key count"))])
        else:  # "P"
            fields.append(
                [(blob(MAX_KEY, "a key"), blob(MAX_VALUE, "a value")) for _ in range(count(MAX_KEYS, "a key count"))]
            )
    return op, fields, pos


class _Conn:
    """One client connection: bytes in, replies out, and what it waits for."""

    __slots__ = (
        "sock",
        "inbuf",
        "need",
        "out",
        "sent",
        "events",
        "valid",
        "awaited",
        "gone",
        "session",
        "resumed",
        "closed",
    )

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.inbuf, self.need = bytearray(), 0  # need: bytes inbuf must hold before parsing is worth it
        self.out, self.sent = bytearray(), 0
        self.events = selectors.EVENT_READ
        self.valid = False  # VALIDATE seen
        self.awaited: set[bytes] = set()  # keys of its pending WAIT (or BARRIER, or WAIT_CHANGE's change)
        self.gone = b""  # the key whose absence its pending WAIT_CHANGE waits for
        self.session: _Session | None = None
        self.resumed = False  # its SESSION found the session live (another connection, or within the grace)
        self.closed = False


class _Session:
    """The connections of one client (an agent), the keys they hold and the adds they made (extension ops)."""

    __slots__ = ("id", "conns", "held", "adds", "ends")

    def __init__(self, sid: int):
        self.id = sid
        self.conns: set[_Conn] = set()
        self.held: set[bytes] = set()
        self.adds: collections.OrderedDict[int, int] = collections.OrderedDict()  # ADD_ONCE id -> its sum
        self.ends = 0.0  # without a connection: when its grace is over


OUT_PAUSE = 1 << 20  # a client with this much unread reply gets no more requests parsed until it reads


class StoreServer:
    """A TCPStore server on exactly `host:port` (0: any free port), run by one thread with epoll.

    Serves torch's clients and ours alike; a client that breaks the protocol loses its own
    connection and nothing else. `grace`: how long a session's held keys outlive its last
    connection (`clock` tells the time). `boot` identifies this server process. `close()` stops it.
    """

    def __init__(self, host: str, port: int, backlog: int = 16384, grace: float = GRACE, clock=time.monotonic):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart on a port in TIME_WAIT
            self._listener.bind((host, port))
            self._listener.listen(backlog)
            self._listener.setblocking(False)
        except BaseException:
            self._listener.close()
            raise
        self.host, self.port = host, self._listener.getsockname()[1]
        self.data: dict[bytes, bytes] = {}
        self.queues: dict[bytes, collections.deque] = {}
        self._waiters: dict[bytes, dict[_Conn, None]] = {}  # key -> connections waiting for it, in order
        self._gone_waiters: dict[bytes, dict[_Conn, None]] = {}  # key -> connections waiting for it to go
        self._sessions: dict[int, _Session] = {}
        self._ending: collections.OrderedDict[int, _Session] = (
            collections.OrderedDict()
        )  # no connection left, by `ends`
        self._holder: dict[bytes, _Session] = {}  # held key -> its session
        self.grace, self._clock = grace, clock
        self.boot = random.getrandbits(64)
        self._conns: set[_Conn] = set()
        self._dirty: set[_Conn] = set()  # replies queued this turn, sent at its end
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ, "stop")
        self._rbuf = bytearray(1 << 18)  # every recv lands here first
        self._rview = memoryview(self._rbuf)
        self._accept_again = 0.0  # out of file descriptors: accept again after this time
        self._stop = False
        self._handlers = {
            VALIDATE: self._validate,
            SET: self._set,
            COMPARE_SET: self._compare_set,
            GET: self._get,
            ADD: self._add,
            CHECK: self._check,
            WAIT: self._wait,
            GETNUMKEYS: self._num_keys,
            DELETE_KEY: self._delete,
            APPEND: self._append,
            MULTI_GET: self._multi_get,
            MULTI_SET: self._multi_set,
            CANCEL_WAIT: self._cancel_wait,
            PING: self._ping,
            QUEUE_PUSH: self._queue_push,
            QUEUE_POP: self._queue_pop,
            QUEUE_LEN: self._queue_len,
            LIST_KEYS: self._list_keys,
            BARRIER: self._barrier,
            SESSION: self._session,
            HOLD: self._hold,
            WAIT_CHANGE: self._wait_change,
            SESSION_INFO: self._session_info,
            ADD_ONCE: self._add_once,
        }
        self._thread = threading.Thread(target=self._loop, name="launcher-store", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving: every connection and the listening socket are closed."""
        if not self._stop:
            self._stop = True
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
        if threading.current_thread() is not self._thread:
            self._thread.join(5)

    # -- the event loop

    def _loop(self) -> None:
        try:
            while not self._stop:
                timeout = None
                if self._accept_again:
                    timeout = max(0.0, self._accept_again - time.monotonic())
                    if timeout == 0.0:
                        self._accept_again = 0.0
                        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
                        timeout = None
                if self._ending:
                    ends = max(0.0, next(iter(self._ending.values())).ends - self._clock())
                    timeout = ends if timeout is None else min(timeout, ends)
                for key, events in self._sel.select(timeout):
                    if key.data == "accept":
                        self._accept()
                    elif isinstance(key.data, _Conn):
                        self._serve(key.data, events)
                if self._ending:  # after the turn's events: a reconnect that came with the close counts
                    self._end_sessions()
                while self._dirty:
                    self._flush(self._dirty.pop())
        finally:
            for c in list(self._conns):
                self._drop(c)
            self._sel.close()
            for s in (self._listener, self._wake_r, self._wake_w):
                s.close()

    def _accept(self) -> None:
        for _ in range(512):  # a burst of agents: many per turn, but let the others speak too
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError:  # out of file descriptors or memory: pause, instead of spinning on the listener
                self._sel.unregister(self._listener)
                self._accept_again = time.monotonic() + 0.1
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = _Conn(sock)
            self._conns.add(c)
            self._sel.register(sock, c.events, c)

    def _serve(self, c: _Conn, events: int) -> None:
        try:
            if events & selectors.EVENT_WRITE:
                self._flush(c)
            if events & selectors.EVENT_READ and not c.closed:
                n = c.sock.recv_into(self._rbuf)  # not recv(256 KiB): that maps and unmaps 256 KiB per call
                if not n:
                    return self._drop(c)
                c.inbuf += self._rview[:n]
            if not c.closed:
                self._process(c)
        except (BlockingIOError, InterruptedError):
            pass
        except Exception:  # the peer went away, broke the protocol, or hit a bug of ours: only it goes
            log.debug("store client dropped", exc_info=True)
            self._drop(c)

    def _process(self, c: _Conn) -> None:
        """Run every whole frame that has arrived, while the client keeps reading its replies."""
        buf, pos = c.inbuf, 0
        if len(buf) < c.need:
            return
        c.need = 0
        while pos < len(buf) and len(c.out) - c.sent <= OUT_PAUSE:
            try:
                op, fields, end = parse(buf, pos)
            except _Incomplete as e:
                c.need = e.need - pos
                if c.need > MAX_FRAME:
                    raise _Malformed(f"a frame of {c.need} bytes or more") from None
                break
            if not c.valid and op != VALIDATE:
                raise _Malformed("the first frame must be VALIDATE")
            self._handlers[op](c, *fields)
            pos = end
        del buf[:pos]

    def _reply(self, c: _Conn, data: bytes) -> None:
        if len(data) > MAX_FRAME:
            raise _Malformed(f"a reply of {len(data)} bytes")
        c.out += data
        self._dirty.add(c)

    def _flush(self, c: _Conn) -> None:
        if c.closed:
            return
        if c.sent < len(c.out):
            try:
                with memoryview(c.out) as view, view[c.sent :] as rest:
                    c.sent += c.sock.send(rest)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                return self._drop(c)
        if c.sent == len(c.out):
            c.out.clear()
            c.sent = 0
        elif c.sent > 1 << 20:
            del c.out[: c.sent]
            c.sent = 0
        pending = len(c.out) - c.sent
        events = (selectors.EVENT_READ if pending <= OUT_PAUSE else 0) | (selectors.EVENT_WRITE if pending else 0)
        if events != c.events:
            c.events = events
            self._sel.modify(c.sock, events, c)
        if pending <= OUT_PAUSE and len(c.inbuf) >= max(c.need, 1):
            try:
                self._process(c)  # requests held back while its replies piled up
            except Exception:
                log.debug("store client dropped", exc_info=True)
                self._drop(c)

    def _drop(self, c: _Conn) -> None:
        if c.closed:
            return
        c.closed = True
        self._unwait(c)
        self._leave_session(c)
        self._conns.discard(c)
        self._dirty.discard(c)
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        _close(c.sock)

    # -- waiting

    def _has(self, key: bytes) -> bool:
        return key in self.data or bool(self.queues.get(key))

    def _await(self, c: _Conn, keys) -> None:
        self._unwait(c)
        c.awaited = set(keys)
        for k in c.awaited:
            self._waiters.setdefault(k, {})[c] = None

    def _unwait(self, c: _Conn) -> None:
        for k in c.awaited:
            _forget_waiter(self._waiters, k, c)
        c.awaited = set()
        if c.gone:
            _forget_waiter(self._gone_waiters, c.gone, c)
            c.gone = b""

    def _wake(self, key: bytes, one: bool = False) -> None:
        """Tell the clients waiting on `key` whose every key is now there (with `one`: the first such)."""
        conns = self._waiters.pop(key, None)
        while conns:
            c = next(iter(conns))
            del conns[c]
            c.awaited.discard(key)
            if not c.awaited:
                self._unwait(c)  # a WAIT_CHANGE's other half
                self._reply(c, U8.pack(STOP_WAITING))
                if one:
                    break
        if conns:
            self._waiters[key] = conns

    def _put(self, key: bytes, value: bytes) -> None:
        self.data[key] = value
        self._wake(key)

    # -- the ops, in the order of the table above

    def _validate(self, c: _Conn, magic: int) -> None:
        if magic != MAGIC:
            raise _Malformed("VALIDATE with the wrong magic number")
        c.valid = True

    def _set(self, c: _Conn, key: bytes, value: bytes) -> None:
        self._put(key, value)

    def _compare_set(self, c: _Conn, key: bytes, expected: bytes, desired: bytes) -> None:
        """As torch's server: an absent key is created only when `expected` is empty; otherwise the
        answer is `expected` itself and nothing is stored (torch's own comment calls that lying)."""
        now = self.data.get(key)
        if now is None:
            if expected:
                return self._reply(c, _str(expected))
            self._put(key, desired)
            now = desired
        elif now == expected:
            self._put(key, desired)
            now = desired
        self._reply(c, _str(now))

    def _get(self, c: _Conn, key: bytes) -> None:
        self._reply(c, _str(self.data.get(key, b"")))

    def _add(self, c: _Conn, key: bytes, delta: int) -> None:
        self._reply(c, I64.pack(self._sum(key, delta)))

    def _sum(self, key: bytes, delta: int) -> int:
        old = self.data.get(key)
        total = _wrap64(delta + (_stoll(old) if old is not None else 0))
        self._put(key, str(total).encode())
        return total

    def _check(self, c: _Conn, keys: list[bytes]) -> None:
        self._reply(c, U8.pack(READY if all(self._has(k) for k in keys) else NOT_READY))

    def _wait(self, c: _Conn, keys: list[bytes]) -> None:
        missing = [k for k in keys if not self._has(k)]
        if missing:
            self._await(c, missing)
        else:
            self._reply(c, U8.pack(STOP_WAITING))

    def _num_keys(self, c: _Conn) -> None:
        self._reply(c, I64.pack(len(self.data)))

    def _delete(self, c: _Conn, key: bytes) -> None:
        self._reply(c, I64.pack(self._remove(key)))

    def _remove(self, key: bytes) -> int:
        """Delete `key` (1 if it was there), release its hold, and answer the WAIT_CHANGEs on its absence."""
        if self.data.pop(key, None) is None:
            return 0
        holder = self._holder.pop(key, None)
        if holder is not None:
            holder.held.discard(key)
        for w in list(self._gone_waiters.pop(key, ())):
            self._unwait(w)
            self._reply(w, U8.pack(GONE))
        return 1

    def _append(self, c: _Conn, key: bytes, value: bytes) -> None:
        new = self.data.get(key, b"") + value
        if len(new) > MAX_VALUE:
            raise _Malformed(f"an append that makes a value of {len(new)} bytes")
        self._put(key, new)

    def _multi_get(self, c: _Conn, keys: list[bytes]) -> None:
        self._reply(c, b"".join(_str(self.data.get(k, b"")) for k in keys))

    def _multi_set(self, c: _Conn, pairs: list[tuple[bytes, bytes]]) -> None:
        for key, value in pairs:
            self._put(key, value)

    def _cancel_wait(self, c: _Conn) -> None:
        self._unwait(c)
        self._reply(c, U8.pack(WAIT_CANCELED))

    def _ping(self, c: _Conn, nonce: int) -> None:
        self._reply(c, U32.pack(nonce))

    def _queue_push(self, c: _Conn, key: bytes, value: bytes) -> None:
        self.queues.setdefault(key, collections.deque()).append(value)
        self._wake(key, one=True)

    def _queue_pop(self, c: _Conn, key: bytes) -> None:
        queue = self.queues.get(key)
        if not queue:
            return self._reply(c, I64.pack(0))
        self._reply(c, I64.pack(len(queue)) + _str(queue.popleft()))

    def _queue_len(self, c: _Conn, key: bytes) -> None:
        self._reply(c, I64.pack(len(self.queues.get(key, ()))))

    def _list_keys(self, c: _Conn) -> None:
        self._reply(c, I64.pack(len(self.data)) + b"".join(_str(k) for k in self.data))

    def _barrier(self, c: _Conn, key: bytes, world: int) -> None:
        """Count this client in at `key`; all go on together once `world` have come."""
        old = self.data.get(key)
        count = _wrap64(_stoll(old) + 1) if old is not None else 1
        self.data[key] = str(count).encode()  # not _put: an arrival wakes nobody
        if count >= world:
            self._wake(key)
            self._reply(c, U8.pack(STOP_WAITING))
        else:
            self._await(c, [key])

    # -- the extension ops (see the module's docstring)

    def _session(self, c: _Conn, sid: int) -> None:
        self._leave_session(c)
        session = self._sessions.get(sid)
        c.resumed = session is not None
        if session is None:
            session = self._sessions[sid] = _Session(sid)
        self._ending.pop(sid, None)  # back within its grace: nothing is deleted
        c.session = session
        session.conns.add(c)
        self._reply(c, U32.pack(EXT_VERSION))

    def _leave_session(self, c: _Conn) -> None:
        """The session's last connection gone: its held keys go once its grace is over (`_end_sessions`)."""
        session, c.session = c.session, None
        if session is None:
            return
        session.conns.discard(c)
        if not session.conns:
            session.ends = self._clock() + self.grace
            self._ending[session.id] = session

    def _end_sessions(self) -> None:
        """Delete the held keys of the sessions whose grace is over (no connection came back)."""
        now = self._clock()
        while self._ending:
            session = next(iter(self._ending.values()))
            if session.ends > now:
                return
            del self._ending[session.id], self._sessions[session.id]
            for key in list(session.held):
                self._remove(key)

    def _session_info(self, c: _Conn) -> None:
        if c.session is None:
            raise _Malformed("SESSION_INFO before SESSION")
        self._reply(c, U64.pack(self.boot) + U8.pack(c.resumed))

    def _add_once(self, c: _Conn, key: bytes, delta: int, rid: int) -> None:
        """ADD, counted once per request id in a session: a resend gets the first sum."""
        if c.session is None:
            raise _Malformed("ADD_ONCE before SESSION")
        adds = c.session.adds
        total = adds.get(rid)
        if total is None:
            total = adds[rid] = self._sum(key, delta)
            if len(adds) > ADDS_KEPT:
                adds.popitem(last=False)
        self._reply(c, I64.pack(total))

    def _hold(self, c: _Conn, key: bytes, value: bytes) -> None:
        if c.session is None:
            raise _Malformed("HOLD before SESSION")
        old = self._holder.get(key)
        if old is not None:
            old.held.discard(key)
        self._holder[key] = c.session
        c.session.held.add(key)
        self._put(key, value)
        self._reply(c, U8.pack(0))  # unlike SET, answered: a watcher on another connection then finds it

    def _wait_change(self, c: _Conn, change: bytes, alive: bytes) -> None:
        if change in self.data:
            return self._reply(c, U8.pack(CHANGED))
        if alive and alive not in self.data:
            return self._reply(c, U8.pack(GONE))
        self._await(c, [change])
        if alive:
            c.gone = alive
            self._gone_waiters.setdefault(alive, {})[c] = None


def _forget_waiter(waiters: dict[bytes, dict[_Conn, None]], key: bytes, c: _Conn) -> None:
    conns = waiters.get(key)
    if conns is not None:
        conns.pop(c, None)
        if not conns:
            del waiters[key]


def _stoll(value: bytes) -> int:
    """The number at the start of `value`, read as C's stoll does (torch's ADD): leading white
    space, a sign, digits, anything after ignored; no digits or past int64 is an error."""
    text = value.lstrip(b" \t\n\v\f\r")
    digits = 1 if text[:1] in (b"+", b"-") else 0
    while digits < len(text) and 48 <= text[digits] <= 57:
        digits += 1
    if digits == 0 or not text[digits - 1 : digits].isdigit():
        raise _Malformed("ADD on a value that is not a number")
    n = int(text[:digits])
    if not -(1 << 63) <= n < 1 << 63:
        raise _Malformed("ADD on a number past int64")
    return n


def _wrap64(n: int) -> int:
    """int64 arithmetic as torch's server does it: overflow wraps around."""
    return (n + (1 << 63)) % (1 << 64) - (1 << 63)
