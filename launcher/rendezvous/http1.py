"""A minimal HTTP/1.1 client connection: keep-alive POSTs, and a streamed answer read line by line
against a deadline.

Why not http.client: a read timeout leaves its socket file unusable (socket.SocketIO refuses
to read after one), so a watch could not be read in slices up to a deadline and then resumed;
and it imports the email package, 15-45 ms of every agent's start. The peer this serves is
etcd's gateway (Go's net/http): bodies come with a Content-Length or chunked, which is all
this reads.
"""

from __future__ import annotations

import select
import socket
import threading
import time

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
        sock = socket.create_connection((host, port), timeout=connect_timeout)
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
        self._raw = bytearray()  # received, not yet parsed
        self._body = bytearray()  # parsed body bytes of a streamed answer, not yet handed out
        self._chunk: int | None = None  # bytes left in the current chunk; None: a size line is next
        self._done = False  # the streamed answer is complete
        self._lock = threading.Lock()
        self.aborted = False

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
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self._timeout(deadline)
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        self._body.clear()
        self._chunk, self._done = None, False

    def head(self, deadline: float) -> tuple[int, dict[str, str]]:
        """Read the status line and headers: (status, {lower-case name: value})."""
        while True:
            end = self._raw.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self._raw) > MAX_HEAD:
                raise Closed("not an HTTP answer")
            self._recv(deadline)
        text = self._raw[:end].decode("latin-1")
        del self._raw[:end + 4]
        status_line, *fields = text.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise Closed(f"not an HTTP answer: {status_line[:80]!r}")
        head = {}
        for field in fields:
            name, _, value = field.partition(":")
            head[name.strip().lower()] = value.strip()
        return int(parts[1]), head

    def read_body(self, head: dict[str, str], deadline: float) -> tuple[bytes, bool]:
        """The whole body of the answer whose `head` was read: (body, whether the connection may be reused)."""
        if head.get("transfer-encoding", "").lower() == "chunked":
            while not self._done:
                self._fill(deadline)
            data = bytes(self._body)
            self._body.clear()
        elif "content-length" in head:
            size = int(head["content-length"])
            if not 0 <= size <= MAX_BODY:
                raise Closed(f"answer of {size} bytes")
            while len(self._raw) < size:
                self._recv(deadline)
            data = bytes(self._raw[:size])
            del self._raw[:size]
        else:  # the body runs to the end of the connection
            while True:
                try:
                    self._recv(deadline)
                except Closed:
                    break
            data, self._raw = bytes(self._raw), bytearray()
            return data, False
        return data, head.get("connection", "").lower() != "close" and not self._raw

    def line(self, deadline: float) -> bytes | None:
        """The next newline-ended line of a chunked answer's body; None once `deadline` passed first.
        Raises Closed at the body's end (or the connection's)."""
        while True:
            end = self._body.find(b"\n")
            if end >= 0:
                out = bytes(self._body[:end])
                del self._body[:end + 1]
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
            self.aborted = True
            try:
                # The plain socket's shutdown: an SSLSocket's own would drop its TLS state under
                # the feet of a thread reading it.
                socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            self.aborted = True
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

    def _recv(self, deadline: float) -> None:
        self._timeout(deadline)
        data = self.sock.recv(65536)  # a timeout raises before anything is consumed: safe to resume
        if not data:
            raise Closed("connection closed by etcd")
        self._raw += data

    def _fill(self, deadline: float) -> None:
        """Decode what chunked bytes are in; receive more when nothing could be decoded."""
        before = (len(self._body), self._done, self._chunk)
        raw = self._raw
        while not self._done:
            if self._chunk is None:  # a size line: hex size, maybe ";extensions"
                end = raw.find(b"\r\n")
                if end < 0:
                    break
                try:
                    size = int(bytes(raw[:end]).split(b";")[0], 16)
                except ValueError:
                    raise Closed("not a chunked answer") from None
                del raw[:end + 2]
                self._chunk = size if size else -1
            elif self._chunk == -1:  # trailers after the last chunk, up to an empty line
                end = raw.find(b"\r\n")
                if end < 0:
                    break
                trailer = raw[:end]
                del raw[:end + 2]
                if not trailer:
                    self._done = True
            elif self._chunk == 0:  # the CRLF that ends a chunk's data
                if len(raw) < 2:
                    break
                del raw[:2]
                self._chunk = None
            else:
                take = min(self._chunk, len(raw))
                if not take:
                    break
                self._body += raw[:take]
                del raw[:take]
                self._chunk -= take
            if len(self._body) > MAX_BODY:
                raise Closed("answer too large")
        if (len(self._body), self._done, self._chunk) == before:
            self._recv(deadline)
