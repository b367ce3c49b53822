"""A TCP relay on loopback whose connections a test cuts, stalls or breaks mid-request."""

from __future__ import annotations

import queue
import selectors
import socket
import struct
import threading


class Relay:
    """A TCP relay on loopback in front of `target` (host, port), whose connections a test breaks.

    One thread accepts and pumps every pair of sockets. `cut(rst=False)` closes every pair now
    (with `rst`: a reset, not a FIN), `stall()` stops moving bytes on the pairs open now (a
    partition that keeps them open), `cut_next(to_server)` closes the pair through which the next
    bytes go that way instead of passing them on. New connections are relayed as before (closed at
    once while `refuse` is set).
    `close()` stops it and closes everything.
    """

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.listener, selectors.EVENT_READ, "accept")
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._other: dict[socket.socket, socket.socket] = {}  # each end -> its other end
        self._upstream: set[socket.socket] = set()  # the ends that face the target
        self._todo: queue.Queue = queue.Queue()
        self._stalled: set[socket.socket] = set()
        self._armed: bool | None = None  # cut_next: True toward the server, False toward the client
        self.refuse = False  # True: a new connection is closed at once (as if nothing were behind the relay)
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self._thread.start()

    def cut(self, rst: bool = False) -> int:
        """Close every relayed connection (both ends) now; how many there were."""
        return self._do(lambda: self._cut_all(rst))

    def stall(self) -> int:
        """Stop passing bytes on the connections open now (they stay open); how many."""
        return self._do(lambda: (self._stalled.update(self._other), len(self._other) // 2)[1])

    def cut_next(self, to_server: bool) -> None:
        """Close the connection through which bytes next go toward the server (or the client) instead."""
        self._do(lambda: setattr(self, "_armed", to_server))

    def close(self) -> None:
        self._do(lambda: self._cut_all(False))
        self._todo.put(None)
        self._wake_w.send(b"x")
        self._thread.join(5)
        for s in (self.listener, self._wake_r, self._wake_w):
            s.close()

    def _do(self, what):
        done: queue.Queue = queue.Queue()
        self._todo.put((what, done))
        self._wake_w.send(b"x")
        return done.get(timeout=10)

    def _cut_all(self, rst: bool) -> int:
        n = len(self._other) // 2
        for sock in list(self._other):
            self._drop(sock, rst)
        return n

    def _drop(self, sock: socket.socket, rst: bool = False) -> None:
        if sock not in self._other:
            return  # dropped already, with its other end
        for s in (sock, self._other[sock]):
            self._other.pop(s, None)
            self._stalled.discard(s)
            self._upstream.discard(s)
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            if rst:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()

    def _run(self) -> None:
        while True:
            for key, _ in self._sel.select():
                if key.data == "wake":
                    self._wake_r.recv(4096)
                    while not self._todo.empty():
                        job = self._todo.get()
                        if job is None:
                            return
                        what, done = job
                        done.put(what())
                elif key.data == "accept":
                    self._accept()
                elif key.fileobj in self._other:
                    self._pump(key.fileobj)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            if self.refuse:
                raise ConnectionRefusedError
            up = socket.create_connection(self.target, timeout=5)
        except OSError:
            conn.close()  # nothing behind the relay: the client sees its connection closed
            return
        self.accepted += 1
        for s in (conn, up):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(5)
        self._other[conn], self._other[up] = up, conn
        self._upstream.add(up)
        self._sel.register(conn, selectors.EVENT_READ, "pair")
        self._sel.register(up, selectors.EVENT_READ, "pair")

    def _pump(self, sock: socket.socket) -> None:
        if sock in self._stalled:
            self._sel.unregister(sock)  # left unread: the peer's bytes wait in the kernel
            return
        try:
            data = sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            return self._drop(sock)
        to_server = sock not in self._upstream
        if self._armed is to_server:
            self._armed = None
            return self._drop(sock)
        try:
            self._other[sock].sendall(data)
        except OSError:
            self._drop(sock)
