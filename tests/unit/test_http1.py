"""The HTTP/1.1 client connection (launcher/rendezvous/etcd/http1.py) against scripted loopback servers:
framing by length, chunks and end of connection, keep-alive, streamed lines read against a deadline
and resumed, aborts from another thread, and answers that are not HTTP."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from launcher.rendezvous.etcd.http1 import Closed, Connection


class Server:
    """Accepts connections on loopback; `script(sock, n)` plays the server's side of connection n."""

    def __init__(self, script):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.script, self.accepted, self.requests = script, 0, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._run, args=(sock, self.accepted), daemon=True).start()

    def _run(self, sock: socket.socket, n: int) -> None:
        with sock:
            try:
                self.script(self, sock, n)
            except OSError:
                pass

    def read_request(self, sock: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            data += _received(sock)
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(
            (int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")), 0
        )
        while len(rest) < length:
            rest += _received(sock)
        self.requests.append((head, rest))
        return rest

    def close(self) -> None:
        # close() alone does not wake a thread blocked in accept() on Linux; shutdown() does.
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


def _received(sock: socket.socket) -> bytes:
    """The next bytes from `sock`; the client's close is an error (a loop on recv() == b"" spins a core
    for the rest of the session: it cost the suite ~340 s of CPU)."""
    data = sock.recv(4096)
    if not data:
        raise ConnectionError("the client closed the connection")
    return data


@pytest.fixture
def serve():
    servers = []

    def start(script) -> tuple[Server, Connection]:
        server = Server(script)
        servers.append(server)
        return server, Connection("127.0.0.1", server.port, connect_timeout=5)

    yield start
    for s in servers:
        s.close()


def soon(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


def test_keep_alive_posts_on_one_connection(serve):
    def script(server, sock, n):
        for _ in range(2):
            body = server.read_request(sock)
            sock.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )

    server, conn = serve(script)
    assert conn.post("/v3/kv/range", b'{"key":"YQ=="}', {"Authorization": "tok"}, soon()) == (
        200,
        b'{"key":"YQ=="}',
        True,
    )
    assert conn.post("/v3/kv/put", b"{}", {}, soon()) == (200, b"{}", True)
    assert server.accepted == 1
    head = server.requests[0][0].decode()
    assert head.startswith("POST /v3/kv/range HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{server.port}" in head.lower() and "authorization: tok" in head.lower()
    conn.close()


def test_connection_close_and_a_body_to_the_end_are_not_reused(serve):
    def script(server, sock, n):
        server.read_request(sock)
        if n == 1:
            sock.sendall(b"HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 4\r\n\r\nnope")
        else:
            sock.sendall(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")

    server, conn = serve(script)
    assert conn.post("/a", b"", {}, soon()) == (404, b"nope", False)
    conn.close()
    conn = Connection("127.0.0.1", server.port, connect_timeout=5)
    assert conn.post("/b", b"", {}, soon()) == (200, b"until the end", False)
    conn.close()


def stream(serve, body) -> Connection:
    """A watch-like exchange: the server answers 200, chunked, then plays `body(sock)`; the
    connection comes back with the head read."""

    def script(server, sock, n):
        server.read_request(sock)
        sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        body(sock)

    _, conn = serve(script)
    conn.send("/v3/watch", b"{}", {}, soon())
    status, head = conn.head(soon())
    assert status == 200 and head["transfer-encoding"] == "chunked"
    return conn


def test_a_chunked_stream_is_read_line_by_line_and_resumes_after_a_deadline(serve):
    go = threading.Event()

    def body(sock):
        sock.sendall(b"6\r\nfirst\n\r\n3;ext=1\r\nsec\r\n")  # "second" split over two chunks
        go.wait(10)
        sock.sendall(b"4\r\nond\n\r\n0\r\nX-Trailer: t\r\n\r\n")

    conn = stream(serve, body)
    assert conn.line(soon()) == b"first"
    assert conn.line(time.monotonic() + 0.05) is None  # half a line so far: the deadline passes first
    go.set()
    assert conn.line(soon()) == b"second"  # resumed where it stopped, nothing lost
    with pytest.raises(Closed, match="the stream ended"):
        conn.line(soon())
    conn.close()


def test_an_abort_from_another_thread_ends_a_blocked_read(serve):
    release = threading.Event()
    conn = stream(serve, lambda sock: release.wait(10))
    threading.Timer(0.05, conn.abort).start()
    t0 = time.monotonic()
    with pytest.raises((Closed, OSError)):
        conn.line(soon(10))
    assert time.monotonic() - t0 < 5
    release.set()
    conn.close()


@pytest.mark.parametrize(
    "answer, message",
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "connection closed by etcd"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "not an HTTP answer"),
        (b"", "connection closed by etcd"),
    ],
)
def test_what_is_not_a_whole_answer_is_closed(serve, answer, message):
    def script(server, sock, n):
        server.read_request(sock)
        sock.sendall(answer)

    _, conn = serve(script)
    with pytest.raises(Closed, match=message):
        conn.post("/x", b"", {}, soon())
    conn.close()


def test_a_deadline_already_passed_sends_nothing(serve):
    _, conn = serve(lambda server, sock, n: server.read_request(sock))
    with pytest.raises(TimeoutError):
        conn.post("/x", b"", {}, time.monotonic() - 1)
    conn.close()


def test_an_idle_connection_the_server_closed_is_not_reused(serve):
    closed = threading.Event()

    def script(server, sock, n):
        server.read_request(sock)
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        sock.shutdown(socket.SHUT_RDWR)
        closed.set()

    _, conn = serve(script)
    assert conn.post("/x", b"", {}, soon()) == (200, b"", True)
    assert closed.wait(5)
    deadline = soon()
    while conn.idle_and_open() and time.monotonic() < deadline:  # the FIN is on its way
        time.sleep(0.01)
    assert not conn.idle_and_open()
    conn.close()
