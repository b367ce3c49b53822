"""The TCPStore server: one thread with epoll, serving torch's clients and ours alike.

A held key lives while any connection of its session is open, and GRACE (0.1 s) after the last
one closed: an agent that died (the kernel closes its sockets at once) loses its keys then, and
its WAIT_CHANGEs wake; a connection of the session that comes back within the grace deletes
nothing. An agent's connections share one session, so one of them closing deletes nothing.
A version-1 client reads SESSION's answer and never sends 203 or 204; a version-2 client on a
version-1 server uses neither, and does not reconnect (it could not tell a restarted server).
"""

from __future__ import annotations

import collections
import logging
import random
import selectors
import socket
import threading
import time

from .wire import (
    ADD,
    ADD_ONCE,
    APPEND,
    BARRIER,
    CANCEL_WAIT,
    CHANGED,
    CHECK,
    COMPARE_SET,
    DELETE_KEY,
    EXT_VERSION,
    GET,
    GETNUMKEYS,
    GONE,
    HOLD,
    I64,
    LIST_KEYS,
    MAGIC,
    MAX_FRAME,
    MAX_VALUE,
    MULTI_GET,
    MULTI_SET,
    NOT_READY,
    PING,
    QUEUE_LEN,
    QUEUE_POP,
    QUEUE_PUSH,
    READY,
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
    Incomplete,
    Malformed,
    close_socket,
    parse,
    str_frame,
)

log = logging.getLogger(__name__)

GRACE = 0.1  # seconds a session's held keys outlive its last connection: a reconnect within it deletes nothing
ADDS_KEPT = 64  # ADD_ONCE answers a session keeps for resends (a client has one request out at a time)


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
            except Incomplete as e:
                c.need = e.need - pos
                if c.need > MAX_FRAME:
                    raise Malformed(f"a frame of {c.need} bytes or more") from None
                break
            if not c.valid and op != VALIDATE:
                raise Malformed("the first frame must be VALIDATE")
            self._handlers[op](c, *fields)
            pos = end
        del buf[:pos]

    def _reply(self, c: _Conn, data: bytes) -> None:
        if len(data) > MAX_FRAME:
            raise Malformed(f"a reply of {len(data)} bytes")
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
        close_socket(c.sock)

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
            raise Malformed("VALIDATE with the wrong magic number")
        c.valid = True

    def _set(self, c: _Conn, key: bytes, value: bytes) -> None:
        self._put(key, value)

    def _compare_set(self, c: _Conn, key: bytes, expected: bytes, desired: bytes) -> None:
        """As torch's server: an absent key is created only when `expected` is empty; otherwise the
        answer is `expected` itself and nothing is stored (torch's own comment calls that lying)."""
        now = self.data.get(key)
        if now is None:
            if expected:
                return self._reply(c, str_frame(expected))
            self._put(key, desired)
            now = desired
        elif now == expected:
            self._put(key, desired)
            now = desired
        self._reply(c, str_frame(now))

    def _get(self, c: _Conn, key: bytes) -> None:
        self._reply(c, str_frame(self.data.get(key, b"")))

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
            raise Malformed(f"an append that makes a value of {len(new)} bytes")
        self._put(key, new)

    def _multi_get(self, c: _Conn, keys: list[bytes]) -> None:
        self._reply(c, b"".join(str_frame(self.data.get(k, b"")) for k in keys))

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
        self._reply(c, I64.pack(len(queue)) + str_frame(queue.popleft()))

    def _queue_len(self, c: _Conn, key: bytes) -> None:
        self._reply(c, I64.pack(len(self.queues.get(key, ()))))

    def _list_keys(self, c: _Conn) -> None:
        self._reply(c, I64.pack(len(self.data)) + b"".join(str_frame(k) for k in self.data))

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
            raise Malformed("SESSION_INFO before SESSION")
        self._reply(c, U64.pack(self.boot) + U8.pack(c.resumed))

    def _add_once(self, c: _Conn, key: bytes, delta: int, rid: int) -> None:
        """ADD, counted once per request id in a session: a resend gets the first sum."""
        if c.session is None:
            raise Malformed("ADD_ONCE before SESSION")
        adds = c.session.adds
        total = adds.get(rid)
        if total is None:
            total = adds[rid] = self._sum(key, delta)
            if len(adds) > ADDS_KEPT:
                adds.popitem(last=False)
        self._reply(c, I64.pack(total))

    def _hold(self, c: _Conn, key: bytes, value: bytes) -> None:
        if c.session is None:
            raise Malformed("HOLD before SESSION")
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
        raise Malformed("ADD on a value that is not a number")
    n = int(text[:digits])
    if not -(1 << 63) <= n < 1 << 63:
        raise Malformed("ADD on a number past int64")
    return n


def _wrap64(n: int) -> int:
    """int64 arithmetic as torch's server does it: overflow wraps around."""
    return (n + (1 << 63)) % (1 << 64) - (1 << 63)
