"""A minimal HTTP/1.1 client connection: keep-alive POSTs, and a streamed answer read line by line
against a deadline. h11 (sans-IO) does the parsing; the socket, its deadlines, aborts from another
thread and the keep-alive decisions are ours.

Why not http.client: a read timeout leaves its socket file unusable (socket.SocketIO refuses
to read after one), so a watch could not be read in slices up to a deadline and then resumed;
and it imports the email package, 15-45 ms of every agent's start. A receive that times out here
consumes nothing, and h11 only ever sees whole received bytes, so a read resumes where it stopped.
"""

from __future__ import annotations

import select
import socket
import threading
import time

import h11

from ...net import lookup_form

MAX_HEAD = 64 * 1024  # a status line and headers longer than this are no HTTP server's
MAX_BODY = 64 * 1024 * 1024


class Closed(ConnectionError):
    """The server closed the connection (before, or in the middle of, an answer)."""


class Connection:
    """One keep-alive connection to host:port, plain or TLS (`context`); not shared between threads,
    except `abort`, which may be called from any thread."""

    def __init__(self, host: str, port: int, *, context=None, connect_timeout: float):
        self.host = f"[{host}]" if ":" in host else host
        self.port = port
        sock = socket.create_connection((lookup_form(host), port), timeout=connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # A watch can wait silently for hours: TCP keep-alives tell a vanished peer (no FIN) in ~11 s.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3)):
                if hasattr(socket, option):
                    sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        self._body = bytearray()  # body bytes of a streamed answer, not yet handed out
        self._done = False  # the streamed answer is complete
        self._eof = False  # the server closed its side
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ a whole exchange

    def post(self, path: str, body: bytes, headers: dict[str, str], deadline: float) -> tuple[int, bytes, bool]:
        """Send one POST and read the whole answer: (status, body, whether the connection may be reused)."""
        self.send(path, body, headers, deadline)
        status, head = self.head(deadline)
        data, keep = self.read_body(head, deadline)
        return status, data, keep

    # ------------------------------------------------------------------ the parts

    def send(self, path: str, body: bytes, headers: dict[str, str], deadline: float, method: str = "POST") -> None:
        """Write one request."""
        h = self._h11
        if h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()  # the last exchange on this kept-alive connection is complete
        if h.our_state is not h11.IDLE:
            raise Closed("the connection is in the middle of another exchange")
        fields = [("Host", f"{self.host}:{self.port}"), ("Content-Length", str(len(body))), *headers.items()]
        try:
            out = h.send(h11.Request(method=method, target=path, headers=fields))
            out += (h.send(h11.Data(data=body)) if body else b"") + h.send(h11.EndOfMessage())
        except h11.LocalProtocolError as e:
            raise Closed(f"cannot send this request: {e}") from None
        self._timeout(deadline)
        self.sock.sendall(out)
        self._body.clear()
        self._done = False

    def head(self, deadline: float) -> tuple[int, dict[str, str]]:
        """Read the status line and headers: (status, {lower-case name: value})."""
        while True:
            event = self._next(deadline)
            if isinstance(event, h11.Response):
                return event.status_code, {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
            if not isinstance(event, h11.InformationalResponse):  # 1xx: the real answer follows
                raise Closed(f"not an HTTP answer: {type(event).__name__}")

    def read_body(self, head: dict[str, str], deadline: float) -> tuple[bytes, bool]:
        """The whole body of the answer whose `head` was read: (body, whether the connection may be reused)."""
        while not self._done:
            self._fill(deadline)
        data = bytes(self._body)
        self._body.clear()
        h = self._h11
        keep = h.our_state is h11.DONE and h.their_state is h11.DONE and not h.trailing_data[0]
        return data, keep  # h11 says MUST_CLOSE for "Connection: close" and for a body that ran to EOF

    def line(self, deadline: float) -> bytes | None:
        """The next newline-ended line of a streamed answer's body; None once `deadline` passed first.
        Raises Closed at the body's end (or the connection's)."""
        while True:
            end = self._body.find(b"\n")
            if end >= 0:
                out = bytes(self._body[:end])
                del self._body[: end + 1]
                return out
            if self._done:
                raise Closed("the stream ended")
            try:
                self._fill(deadline)
            except TimeoutError:
                return None

    def idle_and_open(self) -> bool:
        """True when the server has not closed this kept-alive connection since its last answer
        (a closed one reads as ready, at EOF)."""
        try:
            poller = select.poll()  # not select(): an agent simulating many nodes passes fd 1024
            poller.register(self.sock, select.POLLIN)
            if not poller.poll(0):
                return True
            # Ready can also be TLS 1.3 session tickets, sent after the handshake: not data.
            self.sock.settimeout(0)
            self.sock.recv(1)  # EOF, or bytes nobody asked for: either way not reusable
            return False
        except BlockingIOError:
            return True
        except OSError as e:
            return type(e).__name__ == "SSLWantReadError"  # only TLS records that carry no data
        except ValueError:
            return False

    def abort(self) -> None:
        """End the connection now, from any thread: a read blocked on it returns at once."""
        with self._lock:
            try:
                # The plain socket's shutdown: an SSLSocket's own would drop its TLS state under
                # the feet of a thread reading it.
                socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            try:
                self.sock.close()
            except OSError:
                pass

    # ------------------------------------------------------------------ bytes

    def _timeout(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self.sock.settimeout(left)

    def _next(self, deadline: float):
        """The next parsed event; receives (up to `deadline`) while h11 needs more bytes."""
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as e:
                ended = self._h11.their_state is h11.ERROR and self._eof
                raise Closed("connection closed by etcd" if ended else f"not an HTTP answer: {e}") from None
            if isinstance(event, h11.ConnectionClosed):
                raise Closed("connection closed by etcd")
            if event is not h11.NEED_DATA:
                return event
            self._timeout(deadline)
            data = self.sock.recv(65536)  # a timeout raises before anything is consumed: safe to resume
            self._eof = not data
            self._h11.receive_data(data)  # b"": the end of the connection, which may end a body

    def _fill(self, deadline: float) -> None:
        """Take the next piece of the answer's body (receiving as needed)."""
        event = self._next(deadline)
        if isinstance(event, h11.Data):
            self._body += event.data
            if len(self._body) > MAX_BODY:
                raise Closed("answer too large")
        elif isinstance(event, h11.EndOfMessage):
            self._done = True
        else:
            raise Closed(f"not an HTTP answer: {type(event).__name__} in a body")
