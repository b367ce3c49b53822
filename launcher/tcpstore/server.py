"""The TCPStore server: one thread with epoll, serving torch's clients and ours alike, its resources bounded.

A client that breaks the protocol or a limit loses its own connection and nothing else. The limits
(docs/store.md says how they were chosen):
- a new connection has HANDSHAKE seconds to send its VALIDATE, or it is closed;
- at most `max_conns` connections (default: the descriptor limit less RESERVE, shared by every
  server of the process), a quarter of them not validated yet; at either cap, one that has waited
  EVICT_AFTER s without validating makes room for the newcomer, else the newcomer is refused: it
  reads REFUSED where the handshake's answer would be (our client says so), and is closed;
- each turn of the loop, a connection gets one read (256 KiB) and requests worth TURN_WORK units of
  work at most (a unit: a key touched, or 8 KiB copied): one client cannot starve the others; a
  reply worth more than a turn is built a chunk a turn; requests are parsed as their bytes come
  (wire.RequestParser);
- every reply is sized before it is built: over the budget (or MAX_REPLY) closes the connection; the
  unread replies, replies being built, pending waits, parsed and half-received requests of all
  connections share BUDGET bytes: a reply or wait that does not fit waits (its connection is not read
  meanwhile) until budget is freed (a read, a close), and a half-received request that does not fit
  closes its connection.
"""

from __future__ import annotations

import collections
import logging
import selectors
import socket
import threading
import time
from collections.abc import Iterator

from .descriptors import _FDS, RESERVE, raise_descriptor_limit  # noqa: F401 - RESERVE: read by the tests
from .ops import GRACE, Conn, StoreOps
from .wire import MAX_REPLY, REFUSED, U32, VALIDATE, Malformed, RequestParser, close_socket, fields_cost

log = logging.getLogger(__name__)

HANDSHAKE = 60.0  # seconds a new connection has to send VALIDATE
# At the cap (or the cap of connections not validated yet: a quarter of it, or the job's expected
# connections if more, so idle connections cannot crowd out the clients, nor the process's other
# store), the oldest connection still silent after a turn of the loop and EVICT_AFTER s is read once
# more and, still silent, closed for a newcomer: a client sends its VALIDATE with its connect.
EVICT_AFTER = 0.02
OUT_PAUSE = 1 << 20  # a client with this much unread reply gets no more requests parsed until it reads
SMALL_REPLY = 64 << 10  # a reply this small is always built (the per-connection OUT_PAUSE bounds them)
BUDGET = 256 << 20  # unread replies, waits, parsed and half-received requests, all connections together
TURN_WORK = 1024  # per turn and connection: work worth this many units (a request: 1 + its keys + what it copies)
READ_AHEAD = 4 << 20
# A request waiting for the budget for this long closes the connections that hold a reply over
# SMALL_REPLY and read none of it meanwhile (a client that never reads cannot hold the budget against
# those that do; torch's and our clients read every reply at once).
STALLED = 0.5  # unparsed bytes a connection may hold while its requests wait their turn


class _OverBudget(Exception):
    """The reply does not fit the budget now: the request waits."""


class _Conn(Conn):
    """One client connection: its socket, its request parser, its replies."""

    __slots__ = (
        "sock",
        "parser",
        "inheld",
        "out",
        "sent",
        "events",
        "deferred",
        "parked",
        "accepted",
        "turn",
        "stream",
    )
    __slots__ += ("reserved", "progress")

    def __init__(self, sock: socket.socket, now: float, turn: int):
        super().__init__()
        self.sock = sock
        self.parser = RequestParser()
        self.inheld = 0  # its half-received and deferred requests, as counted in the budget
        self.out, self.sent = bytearray(), 0
        self.events = selectors.EVENT_READ
        self.deferred: tuple[int, list] | None = None  # a request whose reply waits for the budget
        self.parked = 0  # what the deferred request's fields hold
        self.stream: Iterator[bytes] | None = None  # the rest of a reply built a chunk a turn
        self.reserved = 0  # the bytes of that rest (counted in the budget)
        self.progress = 0.0  # when it last read some of its replies (or got one to read)
        self.accepted, self.turn = now, turn  # when it was accepted: a time, and the loop's turn


class StoreServer(StoreOps):
    """A TCPStore server on exactly `host:port` (0: any free port), run by one thread with epoll.

    `expect`: the connections the job will open (it raises the descriptor limit and says when that
    is too low); `max_conns` overrides the cap; `handshake`, `budget`: the limits above; `grace`
    and `clock` as StoreOps. `close()` stops it.
    """

    def __init__(
        self,
        host: str,
        port: int,
        backlog: int = 16384,
        grace: float = GRACE,
        clock=time.monotonic,
        expect: int = 0,
        max_conns: int | None = None,
        handshake: float = HANDSHAKE,
        budget: int = BUDGET,
    ):
        super().__init__(grace, clock)
        self.expect = expect
        # Always: it sets the process's descriptor cap, which every server's accept checks.
        cap = raise_descriptor_limit(expect)
        self.max_conns = cap if max_conns is None else max_conns
        # a job's workers all connect at once, each silent until its process gets the CPU: never fewer
        self.max_greeting = min(self.max_conns, max(2, self.max_conns // 4, expect))
        self.handshake, self.budget = handshake, budget
        self.max_reply = min(MAX_REPLY, budget)
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
        self._conns: set[_Conn] = set()
        self._greeting: collections.OrderedDict[_Conn, None] = collections.OrderedDict()  # not validated, by age
        self._dirty: set[_Conn] = set()  # replies queued this turn, sent at its end
        self._ready: set[_Conn] = set()  # requests left over from a turn: served next turn
        self._starved: collections.OrderedDict[_Conn, None] = collections.OrderedDict()  # waiting for the budget
        self.held = 0  # bytes of unread replies, waits and requests (against `budget`)
        self.peak_held = 0
        self._freed = False  # budget was freed this turn: the starved requests are tried at its end
        self._now = time.monotonic()  # the turn's start
        self._starved_since = 0.0  # when the oldest request waiting for the budget began to
        self.stalled = 0  # connections closed for holding the budget without reading, all told
        self.refused = 0  # connections refused at the cap, all told
        self._told_refused = 0.0
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._rbuf = bytearray(1 << 18)  # every recv lands here first
        self._rview = memoryview(self._rbuf)
        self._accept_again = 0.0  # out of file descriptors: accept again after this time
        self._stop = False
        self._turns = 0  # turns of the loop so far
        self._evict = 0  # connections that never validated to close, asked by another server of the process
        with _FDS.lock:
            _FDS.servers.append(self)
        self._thread = threading.Thread(target=self._loop, name="launcher-store", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving: every connection and the listening socket are closed."""
        if not self._stop:
            self._stop = True
            self._nudge()
        if threading.current_thread() is not self._thread:
            self._thread.join(5)

    # -- the event loop

    def _loop(self) -> None:
        try:
            while not self._stop:
                self._turns += 1
                self._now = time.monotonic()
                for key, events in self._sel.select(self._timeout()):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._woken()
                    elif isinstance(key.data, _Conn):
                        self._serve(key.data, events)
                for c in list(self._ready):  # requests left from the last turn, after this turn's reads
                    if not c.closed:
                        self._guarded(c, self._process)
                if self._ending:  # after the turn's events: a reconnect that came with the close counts
                    self._end_sessions()
                self._expire_greetings()
                if self._starved and self._now - self._starved_since >= STALLED:
                    self._close_stalled()
                if self._freed:
                    self._freed = False
                    if self._starved:
                        self._feed_starved()
                while self._dirty:
                    self._flush(self._dirty.pop())
        finally:
            with _FDS.lock:
                _FDS.servers.remove(self)
                _FDS.expect -= self.expect
            for c in list(self._conns):
                self._drop(c)
            self._sel.close()
            for s in (self._listener, self._wake_r, self._wake_w):
                s.close()

    def _timeout(self) -> float | None:
        if self._ready:
            return 0.0
        now = time.monotonic()
        timeout = max(0.0, self._starved_since + STALLED - now) if self._starved else None
        if self._accept_again:
            timeout = max(0.0, self._accept_again - now)
            if timeout == 0.0:
                self._accept_again = 0.0
                self._sel.register(self._listener, selectors.EVENT_READ, "accept")
                timeout = None
        ends = []
        if self._ending:
            ends.append(next(iter(self._ending.values())).ends - self._clock())
        if self._greeting:
            ends.append(next(iter(self._greeting)).accepted + self.handshake - now)
        for end in ends:
            timeout = max(0.0, end) if timeout is None else min(timeout, max(0.0, end))
        return timeout

    def _accept(self) -> None:
        for _ in range(min(512, self.max_greeting // 2 + 1)):  # a burst of agents; then the others speak
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
            now = time.monotonic()
            full = self._full() or len(self._greeting) >= self.max_greeting
            if full and self._evict_silent(now):
                full = self._full()
            if full:
                self._refuse(sock)
                _FDS.make_room(self)
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = _Conn(sock, now, self._turns)
            with _FDS.lock:
                _FDS.open += 1
            self._conns.add(c)
            self._greeting[c] = None
            self._sel.register(sock, c.events, c)

    def _evict_silent(self, now: float) -> bool:
        """Close the oldest connections not validated yet that had a turn and EVICT_AFTER s, until one
        was silent (True) or none is left to try (False). Each is read first: a client's VALIDATE that
        arrived in this very turn (a burst of thousands of workers) validates it instead."""
        while self._greeting:
            oldest = next(iter(self._greeting))
            if oldest.turn >= self._turns or now - oldest.accepted < EVICT_AFTER:
                return False
            self._guarded(oldest, self._receive)
            if oldest in self._greeting:
                self._drop(oldest)
                return True
        return False

    def _full(self) -> bool:
        with _FDS.lock:
            return len(self._conns) >= self.max_conns or _FDS.open >= _FDS.cap

    def _nudge(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _evict_soon(self) -> None:
        """(Another server's thread) close this server's oldest connection that never validated."""
        self._evict += 1
        self._nudge()

    def _woken(self) -> None:
        try:
            self._wake_r.recv(4096)
        except OSError:
            pass
        evict, self._evict = self._evict, 0
        now = time.monotonic()
        for _ in range(evict):
            if not self._evict_silent(now):
                return

    def _refuse(self, sock: socket.socket) -> None:
        """At the cap: say so in place of the handshake's answer, and close."""
        self.refused += 1
        try:
            sock.setblocking(False)
            sock.send(U32.pack(REFUSED))
        except OSError:
            pass
        close_socket(sock)
        now = time.monotonic()
        if now - self._told_refused >= 10.0:
            self._told_refused = now
            log.warning(
                "the store on port %d is at its cap of %d connections: refusing new ones (%d so far); "
                "raise the open-file limit (ulimit -n) if the job needs more",
                self.port,
                self.max_conns,
                self.refused,
            )

    def _expire_greetings(self) -> None:
        """Close the connections that did not validate within `handshake` s."""
        if not self._greeting:
            return
        now = time.monotonic()
        while self._greeting:
            c = next(iter(self._greeting))
            if c.accepted + self.handshake > now:
                return
            log.debug("closed a connection that sent no handshake within %g s", self.handshake)
            self._drop(c)

    def _serve(self, c: _Conn, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush(c)
        if events & selectors.EVENT_READ and not c.closed:
            self._guarded(c, self._receive)
            if c in self._dirty:  # its answers go at once, not after the turn's other clients
                self._dirty.discard(c)
                self._flush(c)

    def _guarded(self, c: _Conn, step) -> None:
        try:
            step(c)
        except (BlockingIOError, InterruptedError):
            pass
        except Exception:  # the peer went away, broke the protocol, or hit a bug of ours: only it goes
            log.debug("store client dropped", exc_info=True)
            self._drop(c)

    def _receive(self, c: _Conn) -> None:
        n = c.sock.recv_into(self._rbuf)  # not recv(256 KiB): that maps and unmaps 256 KiB per call
        if not n:
            return self._drop(c)
        c.parser.feed(self._rview[:n])
        self._process(c)

    def _process(self, c: _Conn) -> None:
        """Run the whole requests that have arrived, TURN_WORK's worth, while the client reads its replies."""
        self._ready.discard(c)
        if c.deferred is None:
            self._run(c)
        self._count_inbound(c)
        if c not in self._dirty:  # else its flush, at the turn's end, sets what to wait for once
            self._interest(c)

    def _run(self, c: _Conn) -> None:
        parser, work = c.parser, 0
        while len(c.out) - c.sent <= OUT_PAUSE:
            if work >= TURN_WORK:
                self._ready.add(c)
                break
            if c.stream is not None:  # a large reply first, a chunk a turn
                self._pump(c)
                work += TURN_WORK
                continue
            request = parser.next()
            if request is None:
                break
            op, fields = request
            if not c.valid and op != VALIDATE:
                raise Malformed("the first frame must be VALIDATE")
            self.spent = 0
            try:
                self.handlers[op](c, *fields)
            except _OverBudget:
                c.deferred, c.parked = request, fields_cost(fields)
                if not self._starved:
                    self._starved_since = self._now
                self._starved[c] = None
                break
            work += 1 + sum(len(f) for f in fields if isinstance(f, list)) + self.spent

    def _pump(self, c: _Conn) -> None:
        """Build the next chunk of the connection's large reply (its bytes were counted when it began)."""
        chunk = next(c.stream, None)
        if chunk is not None:
            c.out += chunk
            moved = min(len(chunk), c.reserved)
            c.reserved -= moved
            self.held += len(chunk) - moved
            self._dirty.add(c)
        if chunk is None or not c.reserved:
            self.held -= c.reserved
            c.stream, c.reserved = None, 0

    def _count_inbound(self, c: _Conn) -> None:
        """Budget the parsed and half-received requests: a half-received one that does not fit closes its connection."""
        now = c.parser.holding + c.parked
        self.held += now - c.inheld
        c.inheld = now
        if now - c.parked > SMALL_REPLY and self.held > self.budget:
            log.warning(
                "closed a store connection sending a %d-byte request: the store holds %d bytes, over its budget",
                now,
                self.held,
            )
            raise Malformed("over the memory budget")
        self.peak_held = max(self.peak_held, self.held)

    def _interest(self, c: _Conn) -> None:
        pending = len(c.out) - c.sent
        paused = pending > OUT_PAUSE or c.deferred is not None or (c in self._ready and c.parser.held > READ_AHEAD)
        events = (0 if paused else selectors.EVENT_READ) | (selectors.EVENT_WRITE if pending else 0)
        if events != c.events and not c.closed:
            if not c.events:
                self._sel.register(c.sock, events, c)
            elif not events:  # selectors takes no empty mask: out of the selector until its turn or the budget
                self._sel.unregister(c.sock)
            else:
                self._sel.modify(c.sock, events, c)
            c.events = events

    def _validate(self, c: Conn, magic: int) -> None:
        super()._validate(c, magic)
        self._greeting.pop(c, None)

    def _afford(self, c: Conn, size: int) -> None:
        if size > self.max_reply:
            raise Malformed(f"a reply of {size} bytes (over {self.max_reply})")
        others = self.held - c.inheld  # not the request's own parsed fields: they go once it is served
        if size > SMALL_REPLY and others + size > self.budget and others > 0:
            raise _OverBudget

    def _afford_wait(self, c: Conn, size: int) -> None:
        if size > SMALL_REPLY and self.waiting + size > self.budget // 2:
            log.warning(
                "closed a store connection whose WAIT would hold %d bytes: the waits hold %d, half the budget at most",
                size,
                self.waiting,
            )
            raise Malformed("a WAIT over the waits' half of the budget")

    def _charge(self, size: int) -> None:
        self.held += size
        if size < 0:
            self._freed = True
        else:
            self.peak_held = max(self.peak_held, self.held)

    def _stream(self, c: Conn, size: int, units: int, chunks: Iterator[bytes]) -> None:
        if units <= TURN_WORK:
            return super()._stream(c, size, units, chunks)
        if c.sent == len(c.out):
            c.progress = self._now
        c.stream, c.reserved = chunks, size
        self._charge(size)
        self._ready.add(c)

    def _reply(self, c: Conn, data: bytes) -> None:
        if c.sent == len(c.out):
            c.progress = self._now
        c.out += data
        self.held += len(data)
        self.peak_held = max(self.peak_held, self.held)
        self._dirty.add(c)

    def _flush(self, c: _Conn) -> None:
        if c.closed:
            return
        if c.sent < len(c.out):
            try:
                with memoryview(c.out) as view, view[c.sent :] as rest:
                    n = c.sock.send(rest)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                return self._drop(c)
            c.sent += n
            self.held -= n
            if n:
                self._freed, c.progress = True, self._now
        if c.sent == len(c.out):
            c.out.clear()
            c.sent = 0
        elif c.sent > 1 << 20:
            del c.out[: c.sent]
            c.sent = 0
        self._interest(c)
        if len(c.out) - c.sent <= OUT_PAUSE and c.deferred is None and not (c.parser.idle and c.stream is None):
            # requests (or a reply's chunks) held back while its replies piled up: next turn, even when
            # one send took its replies from over OUT_PAUSE to under it, its reading never paused
            self._ready.add(c)

    def _close_stalled(self) -> None:
        """A request has waited STALLED s for the budget: close the connections holding a reply over
        SMALL_REPLY that they have not read from for as long."""
        stalled = [
            c
            for c in self._conns
            if len(c.out) - c.sent + c.reserved > SMALL_REPLY and self._now - c.progress >= STALLED
        ]
        unread = sum(len(c.out) - c.sent + c.reserved for c in stalled)
        for c in stalled:
            self._drop(c)
        if stalled:
            self.stalled += len(stalled)
            log.warning(
                "closed %d store connections that left %d bytes of replies unread for %g s while other "
                "clients waited for the store's memory budget",
                len(stalled),
                unread,
                STALLED,
            )
        self._starved_since = self._now  # the next look, STALLED s on

    def _feed_starved(self) -> None:
        """Run the requests that waited for the budget, oldest first, while they fit."""
        while self._starved:
            c = next(iter(self._starved))
            op, fields = c.deferred
            try:
                self.handlers[op](c, *fields)
            except _OverBudget:
                return
            except Exception:
                log.debug("store client dropped", exc_info=True)
                self._drop(c)
                continue
            del self._starved[c]
            self._starved_since = self._now
            self.held -= c.parked
            c.inheld -= c.parked
            c.deferred, c.parked = None, 0
            self._ready.add(c)  # its next requests, next turn

    def _drop(self, c: _Conn) -> None:
        if c.closed:
            return
        c.closed = True
        with _FDS.lock:
            _FDS.open -= 1
        self.held -= len(c.out) - c.sent + c.inheld + c.reserved
        self._freed = True
        c.stream, c.reserved = None, 0
        self._unwait(c)
        self._leave_session(c)
        self._conns.discard(c)
        self._dirty.discard(c)
        self._ready.discard(c)
        self._greeting.pop(c, None)
        self._starved.pop(c, None)
        if c.events:
            try:
                self._sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
        close_socket(c.sock)
