"""What each store op does: the keys, the waits, the sessions and their held keys (no sockets here).

A held key lives while any connection of its session is open, and GRACE (5 s, a lease) after the
last one closed: a connection that breaks and is opened again within it deletes nothing, however
slow the reconnect (a lost SYN alone costs 1 s). The server cannot tell a dead agent from a cut
connection (the kernel closes both alike), so a death is told by one who knows: END_SESSION, sent by
the agent's guard process the moment the agent died (its death certificate), or by the agent as it
leaves, ends the session at once. An agent's connections share one session, so one of them closing
deletes nothing. A held key is deleted only by its own session or by the session's end (another's
DELETE_KEY answers 0 and deletes nothing), and only the end of its session is a death to a
WAIT_CHANGE (GONE): the server keeps the names its ended sessions released (the last RELEASED_KEPT).
A version-1 client reads SESSION's answer and never sends 203 to 205; a version-2 client on a
version-1 server uses neither, and does not reconnect (it could not tell a restarted server).
"""

from __future__ import annotations

import collections
import itertools
import random
import re
import time
from collections.abc import Callable, Iterator

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
    END_SESSION,
    EXT_VERSION,
    GET,
    GETNUMKEYS,
    GONE,
    HOLD,
    I64,
    LIST_KEYS,
    MAGIC,
    MAX_REPLY,
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
    Malformed,
    str_frame,
)

BYTES_PER_UNIT = 8 << 10  # bytes an op copies worth one unit of a turn's work (a unit: about one key touched)
WAITER = 512  # what a pending wait costs beyond its list of keys (its registration on one key: tracemalloc)
KEY_SLOT = 56  # what each key of that list costs beyond its bytes (a list slot, a bytes object's header)
STREAM_KEYS = 1024  # keys (or values) per chunk of a large reply (a server builds one chunk a turn)
# Seconds a session's held keys outlive its last connection: a reconnect within it deletes nothing. The
# client tries for RECONNECT_WITHIN (5 s, rendezvous/c10d.py): any reconnect it completes finds its keys.
GRACE = 5.0
RELEASED_KEPT = 1024  # held keys released by their sessions' end, for a later WAIT_CHANGE (8 MiB at most)
ADDS_KEPT = 64  # ADD_ONCE answers a session keeps for resends (a client has one request out at a time)


class Conn:
    """One client connection as the ops see it: what it waits for, its session (the server adds the rest)."""

    __slots__ = ("valid", "awaited", "waitat", "gone", "session", "resumed", "closed", "waitheld")

    def __init__(self) -> None:
        self.valid = False  # VALIDATE seen
        # the keys of its pending WAIT (or BARRIER, or WAIT_CHANGE's change); it is registered on one,
        # awaited[waitat]: every key before it was there, and is looked at again only once it arrives
        self.awaited: list[bytes] = []
        self.waitat = 0
        self.gone = b""  # the key whose absence its pending WAIT_CHANGE waits for
        self.session: Session | None = None
        self.resumed = False  # its SESSION found the session live (another connection, or within the grace)
        self.closed = False
        self.waitheld = 0  # what its pending wait costs the server (charged to the budget)


class Session:
    """The connections of one client (an agent), the keys they hold and the adds they made (extension ops)."""

    __slots__ = ("id", "conns", "held", "adds", "ends")

    def __init__(self, sid: int):
        self.id = sid
        self.conns: set[Conn] = set()
        self.held: set[bytes] = set()
        self.adds: collections.OrderedDict[int, int] = collections.OrderedDict()  # ADD_ONCE id -> its sum
        self.ends = 0.0  # without a connection: when its grace is over


OUT_PAUSE = 1 << 20  # a client with this much unread reply gets no more requests parsed until it reads


class StoreOps:
    """The store's state and one method per op; a server subclass moves the bytes (`_reply`, `_stream`),
    bounds what a reply may cost (`_afford`) and counts what waits hold (`_charge`). Each op adds to
    `spent` the units of work it did beyond one per request and key. `grace`: how long a session's held
    keys outlive its last connection (`clock` tells the time). `boot` identifies this server process."""

    def __init__(self, grace: float = GRACE, clock: Callable[[], float] = time.monotonic):
        self.data: dict[bytes, bytes] = {}
        self.queues: dict[bytes, collections.deque] = {}
        self._waiters: dict[bytes, dict[Conn, None]] = {}  # key -> connections waiting for it, in order
        self._gone_waiters: dict[bytes, dict[Conn, None]] = {}  # key -> connections waiting for it to go
        self._sessions: dict[int, Session] = {}
        self._ending: collections.OrderedDict[int, Session] = collections.OrderedDict()  # no connection, by `ends`
        self._holder: dict[bytes, Session] = {}  # held key -> its session
        self._released: collections.OrderedDict[bytes, None] = collections.OrderedDict()  # by an ended session
        self.grace, self._clock = grace, clock
        self.max_reply = MAX_REPLY  # the largest reply (and so value) served
        self.spent = 0  # units of work of the op being run, beyond 1 + its keys (the server resets it)
        self.waiting = 0  # what the pending waits hold, all together
        self.boot = random.getrandbits(64)
        self.handlers = {
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
            END_SESSION: self._end_session,
        }

    def _reply(self, c: Conn, data: bytes) -> None:
        """Queue `data` for `c` (the server sends it)."""
        raise NotImplementedError

    def _afford(self, c: Conn, size: int) -> None:
        """Raise before a reply of `size` bytes is built if it may not be now (the server's limits)."""

    def _charge(self, size: int) -> None:
        """Memory a wait or a reply being built holds (negative: released), for the server's budget."""

    def _afford_wait(self, c: Conn, size: int) -> None:
        """Raise (Malformed) if a wait holding `size` bytes may not be registered (the server's limits)."""

    def _stream(self, c: Conn, size: int, units: int, chunks: Iterator[bytes]) -> None:
        """Queue a reply of `size` bytes made of `chunks` (of STREAM_KEYS items or BYTES_PER_UNIT *
        STREAM_KEYS bytes at most), worth `units` of work all told; a server builds a large one a chunk
        a turn."""
        self.spent += units
        self._reply(c, b"".join(chunks))

    # -- waiting

    def _has(self, key: bytes) -> bool:
        return key in self.data or bool(self.queues.get(key))

    def _await(self, c: Conn, keys: list[bytes], cost: int = 0) -> None:
        """Wait for `keys` (the first not there yet: keys[0]), registered on one key at a time."""
        self._unwait(c)
        c.awaited, c.waitat = keys, 0
        self._waiters.setdefault(keys[0], {})[c] = None
        c.waitheld = cost or _wait_cost(keys)
        self.waiting += c.waitheld
        self._charge(c.waitheld)

    def _unwait(self, c: Conn) -> None:
        if c.awaited:
            _forget_waiter(self._waiters, c.awaited[c.waitat], c)
            c.awaited = []
        if c.waitheld:
            self.waiting -= c.waitheld
            self._charge(-c.waitheld)
            c.waitheld = 0
        if c.gone:
            _forget_waiter(self._gone_waiters, c.gone, c)
            c.gone = b""

    def _wake(self, key: bytes, one: bool = False) -> None:
        """Tell the clients waiting on `key` whose every key is now there (with `one`: the first such)."""
        conns = self._waiters.pop(key, None)
        while conns:
            c = next(iter(conns))
            del conns[c]
            keys, at = c.awaited, c.waitat + 1
            while at < len(keys) and self._has(keys[at]):  # each key of a wait is looked at once after its turn
                at += 1
            self.spent += at - c.waitat
            if at < len(keys):
                c.waitat = at
                self._waiters.setdefault(keys[at], {})[c] = None
                continue
            c.awaited = []
            self._unwait(c)  # its cost, and a WAIT_CHANGE's other half
            self._reply(c, U8.pack(STOP_WAITING))
            if one:
                break
        if conns:
            self._waiters[key] = conns

    def _put(self, key: bytes, value: bytes) -> None:
        self.data[key] = value
        self._wake(key)

    # -- the ops, in the order of the table above

    def _validate(self, c: Conn, magic: int) -> None:
        if magic != MAGIC:
            raise Malformed("VALIDATE with the wrong magic number")
        c.valid = True

    def _set(self, c: Conn, key: bytes, value: bytes) -> None:
        self._put(key, value)

    def _compare_set(self, c: Conn, key: bytes, expected: bytes, desired: bytes) -> None:
        """As torch's server: an absent key is created only when `expected` is empty; otherwise the
        answer is `expected` itself and nothing is stored (torch's own comment calls that lying).
        The answer is sized before anything changes: one that waits for the budget changed nothing."""
        now = self.data.get(key)
        store = (now is None and not expected) or (now is not None and now == expected)
        answer = desired if store else (expected if now is None else now)
        self._afford(c, 8 + len(answer))
        if store:
            self._put(key, desired)
        self.spent += (len(answer) + len(expected)) // BYTES_PER_UNIT
        self._reply(c, str_frame(answer))

    def _get(self, c: Conn, key: bytes) -> None:
        value = self.data.get(key, b"")
        self._afford(c, 8 + len(value))
        self.spent += len(value) // BYTES_PER_UNIT
        self._reply(c, str_frame(value))

    def _add(self, c: Conn, key: bytes, delta: int) -> None:
        self._reply(c, I64.pack(self._sum(key, delta)))

    def _sum(self, key: bytes, delta: int) -> int:
        old = self.data.get(key)
        total = _wrap64(delta + (_stoll(old) if old is not None else 0))
        self._put(key, str(total).encode())
        return total

    def _check(self, c: Conn, keys: list[bytes]) -> None:
        self._reply(c, U8.pack(READY if all(self._has(k) for k in keys) else NOT_READY))

    def _wait(self, c: Conn, keys: list[bytes]) -> None:
        missing = [k for k in keys if not self._has(k)]
        if missing:
            cost = _wait_cost(missing)
            self._afford_wait(c, cost)
            self._await(c, missing, cost)
        else:
            self._reply(c, U8.pack(STOP_WAITING))

    def _num_keys(self, c: Conn) -> None:
        self._reply(c, I64.pack(len(self.data)))

    def _delete(self, c: Conn, key: bytes) -> None:
        holder = self._holder.get(key)
        if holder is not None and holder is not c.session:  # a live agent's key: only its death removes it
            return self._reply(c, I64.pack(0))
        self._reply(c, I64.pack(self._remove(key)))

    def _remove(self, key: bytes, ended: bool = False) -> int:
        """Delete `key` (1 if it was there) and release its hold; `ended`: by its session's end, a death
        to the WAIT_CHANGEs on its absence (answered GONE; its holder deleting it is no death)."""
        if self.data.pop(key, None) is None:
            return 0
        holder = self._holder.pop(key, None)
        if holder is not None:
            holder.held.discard(key)
        if ended:
            self._released[key] = None
            if len(self._released) > RELEASED_KEPT:
                self._released.popitem(last=False)
            for w in list(self._gone_waiters.pop(key, ())):
                self._unwait(w)
                self._reply(w, U8.pack(GONE))
        return 1

    def _append(self, c: Conn, key: bytes, value: bytes) -> None:
        """Grow the value in place (a bytearray): linear in what is appended, not in the value."""
        old = self.data.get(key)
        size = len(value) + (len(old) if old is not None else 0)
        if size + 8 > self.max_reply:
            raise Malformed(f"an append that makes a value of {size} bytes (a GET could not answer it)")
        if type(old) is bytearray:
            old += value
        else:
            self.spent += size // BYTES_PER_UNIT  # once: the value becomes growable
            self._put(key, bytearray(old or b"") + value)
        self.spent += len(value) // BYTES_PER_UNIT

    def _multi_get(self, c: Conn, keys: list[bytes]) -> None:
        values = list(map(self.data.get, keys, itertools.repeat(b"")))
        size = 8 * len(values) + sum(map(len, values))
        self._afford(c, size)  # sized before it is built
        # a later APPEND grows a bytearray in place: the reply keeps the value this request saw
        values = [v if type(v) is bytes else bytes(v) for v in values] if size > BYTES_PER_UNIT else values
        self._stream(c, size, size // BYTES_PER_UNIT, _values_chunks(values))  # its keys are counted already

    def _multi_set(self, c: Conn, pairs: list[tuple[bytes, bytes]]) -> None:
        for key, value in pairs:
            self._put(key, value)

    def _cancel_wait(self, c: Conn) -> None:
        self._unwait(c)
        self._reply(c, U8.pack(WAIT_CANCELED))

    def _ping(self, c: Conn, nonce: int) -> None:
        self._reply(c, U32.pack(nonce))

    def _queue_push(self, c: Conn, key: bytes, value: bytes) -> None:
        self.queues.setdefault(key, collections.deque()).append(value)
        self._wake(key, one=True)

    def _queue_pop(self, c: Conn, key: bytes) -> None:
        queue = self.queues.get(key)
        if not queue:
            return self._reply(c, I64.pack(0))
        self._afford(c, 16 + len(queue[0]))
        self._reply(c, I64.pack(len(queue)) + str_frame(queue.popleft()))

    def _queue_len(self, c: Conn, key: bytes) -> None:
        self._reply(c, I64.pack(len(self.queues.get(key, ()))))

    def _list_keys(self, c: Conn) -> None:
        keys = list(self.data)
        size = 8 + 8 * len(keys) + sum(map(len, keys))
        self._afford(c, size)
        self._stream(c, size, len(keys) + size // BYTES_PER_UNIT, _keys_chunks(keys))

    def _barrier(self, c: Conn, key: bytes, world: int) -> None:
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

    def _session(self, c: Conn, sid: int) -> None:
        self._leave_session(c)
        session = self._sessions.get(sid)
        c.resumed = session is not None
        if session is None:
            session = self._sessions[sid] = Session(sid)
        self._ending.pop(sid, None)  # back within its grace: nothing is deleted
        c.session = session
        session.conns.add(c)
        self._reply(c, U32.pack(EXT_VERSION))

    def _leave_session(self, c: Conn) -> None:
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
            self._close_session(session)

    def _close_session(self, session: Session) -> None:
        """End `session` now: its held keys go (a death to whoever waits on them); its connections stay,
        outside any session."""
        self._ending.pop(session.id, None)
        self._sessions.pop(session.id, None)
        for c in session.conns:
            c.session = None
        session.conns.clear()
        for key in list(session.held):
            self._remove(key, ended=True)

    def _end_session(self, c: Conn) -> None:
        """END_SESSION: the session's process is gone (its guard's death certificate) or leaves."""
        if c.session is None:
            raise Malformed("END_SESSION before SESSION")
        self._close_session(c.session)
        self._reply(c, U8.pack(0))

    def _session_info(self, c: Conn) -> None:
        if c.session is None:
            raise Malformed("SESSION_INFO before SESSION")
        self._reply(c, U64.pack(self.boot) + U8.pack(c.resumed))

    def _add_once(self, c: Conn, key: bytes, delta: int, rid: int) -> None:
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

    def _hold(self, c: Conn, key: bytes, value: bytes) -> None:
        if c.session is None:
            raise Malformed("HOLD before SESSION")
        old = self._holder.get(key)
        if old is not None:
            old.held.discard(key)
        self._holder[key] = c.session
        c.session.held.add(key)
        self._released.pop(key, None)
        self._put(key, value)
        self._reply(c, U8.pack(0))  # unlike SET, answered: a watcher on another connection then finds it

    def _wait_change(self, c: Conn, change: bytes, alive: bytes) -> None:
        if change in self.data:
            return self._reply(c, U8.pack(CHANGED))
        if alive and alive not in self.data and alive in self._released:  # its agent's session ended
            return self._reply(c, U8.pack(GONE))
        self._await(c, [change])
        if alive:
            c.gone = alive
            self._gone_waiters.setdefault(alive, {})[c] = None

    def announce_when_named(self, names: re.Pattern, size: int, key: bytes, value: Callable[[], bytes]) -> None:
        """Once `size` connections have each named a key in which `names` is found (in any op that names
        keys), store `key` as `value()`, waking whoever waits for it, and stop looking. Call it before
        those clients connect; it runs on the server's thread after that. The agent learns from it when
        its workers' process group formed (`agent.bootstrap`)."""
        named: set[Conn] = set()
        plain = {op: self.handlers[op] for op in _NAMING}

        def looked(op: int) -> Callable:
            inner = plain[op]

            def handler(c: Conn, *fields) -> None:
                if c not in named and any(names.search(k) for k in _named_keys(op, fields)):
                    named.add(c)
                    if len(named) >= size:
                        self.handlers.update(plain)  # counted: every op runs as before, at no cost
                        self._put(key, value())
                inner(c, *fields)

            return handler

        self.handlers.update({op: looked(op) for op in _NAMING})


_NAMING = (SET, COMPARE_SET, GET, ADD, CHECK, WAIT, APPEND, MULTI_GET, MULTI_SET)  # the ops that name keys


def _named_keys(op: int, fields: tuple) -> list[bytes]:
    """The keys a request of `op` names, from its fields as the parser hands them."""
    first = fields[0]
    if op == MULTI_SET:
        return [k for k, _ in first]
    return first if isinstance(first, list) else [first]


def _wait_cost(keys: list[bytes]) -> int:
    return WAITER + len(keys) * KEY_SLOT + sum(map(len, keys))


def _values_chunks(values: list) -> Iterator[bytes]:
    """A MULTI_GET's answer, STREAM_KEYS values or about BYTES_PER_UNIT * STREAM_KEYS bytes at a time."""
    at = 0
    while at < len(values):
        end, size = at, 0
        while end < len(values) and end - at < STREAM_KEYS and size < BYTES_PER_UNIT * STREAM_KEYS:
            size += len(values[end])
            end += 1
        yield b"".join(itertools.chain.from_iterable((U64.pack(len(v)), v) for v in values[at:end]))
        at = end


def _keys_chunks(keys: list[bytes]) -> Iterator[bytes]:
    """LIST_KEYS's answer: the count, then STREAM_KEYS keys at a time."""
    yield I64.pack(len(keys))
    for at in range(0, len(keys), STREAM_KEYS):
        part = keys[at : at + STREAM_KEYS]
        yield b"".join(itertools.chain.from_iterable(zip(map(U64.pack, map(len, part)), part)))


def _forget_waiter(waiters: dict[bytes, dict[Conn, None]], key: bytes, c: Conn) -> None:
    conns = waiters.get(key)
    if conns is not None:
        conns.pop(c, None)
        if not conns:
            del waiters[key]


_NUMBER = re.compile(rb"[ \t\n\v\f\r]*([+-]?)(0*)([0-9]{0,20})")


def _stoll(value: bytes) -> int:
    """The number at the start of `value`, read as C's stoll does (torch's ADD): leading white
    space, a sign, digits, anything after ignored; no digits or past int64 is an error. Linear, in C
    (re): an 8 MiB run of zeros or digits costs milliseconds."""
    m = _NUMBER.match(value)
    if m.end() == m.end(1):
        raise Malformed("ADD on a value that is not a number")
    if m.end(3) - m.start(3) == 20:
        raise Malformed("ADD on a number past int64")
    n = int(m.group(3) or b"0")
    if m.group(1) == b"-":
        n = -n
    if not -(1 << 63) <= n < 1 << 63:
        raise Malformed("ADD on a number past int64")
    return n


def _wrap64(n: int) -> int:
    """int64 arithmetic as torch's server does it: overflow wraps around."""
    return (n + (1 << 63)) % (1 << 64) - (1 << 63)
