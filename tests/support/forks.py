"""Python snippets that need torch.distributed, each run in a process of its own forked from one host that
imported it once (support/fork_host.py): a torch store server or client then starts in ~10 ms of CPU
instead of ~2.5 s. The host starts on first use, one per xdist worker, and ends with it.

`popen(code, *args)` is `subprocess.Popen([python, "-c", code, *args], stdin=PIPE, stdout=PIPE, text=True)`
and `run(code, *args, timeout=)` is `subprocess.run(..., capture_output=True, text=True)`, for what the
tests ask of those.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HOST = Path(__file__).with_name("fork_host.py")


class Forked:
    """A snippet's process, as much of `subprocess.Popen` as the tests use."""

    def __init__(self, conn: socket.socket):
        self.conn, self.read, self.stdin, self.stdout, self.returncode, self.pid = conn, b"", None, None, None, None
        self.pid = int(self._line(None))  # the host's first line; its second is the exit status

    def _line(self, timeout: float | None) -> bytes:
        # one buffer for both lines: a child that ends at once has its status sent right behind its pid
        self.conn.settimeout(timeout)
        while b"\n" not in self.read:
            try:
                chunk = self.conn.recv(64)
            except TimeoutError:
                raise subprocess.TimeoutExpired(f"fork {self.pid}", timeout) from None
            if not chunk:
                raise RuntimeError("the fork host ended before its child did")
            self.read += chunk
        line, self.read = self.read.split(b"\n", 1)
        return line

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = int(self._line(timeout))
            self.conn.close()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # ended already; its status is on the way


class Host:
    """support/fork_host.py in a process of its own, listening on a socket in a folder of its own."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="forks-", dir="/tmp")  # a socket path has 107 bytes at most
        self.socket = os.path.join(self.folder, "host")
        env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}
        self.proc = subprocess.Popen(
            [sys.executable, str(HOST), self.socket], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        assert self.proc.stdout.readline() == b"ready\n", "the fork host did not start"

    def start(self, code: str, args: tuple[str, ...], env: dict[str, str], cwd: str, streams: list[int]) -> Forked:
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(self.socket)
        request = {"code": code, "args": list(args), "env": env, "cwd": cwd}
        socket.send_fds(conn, [json.dumps(request).encode()], streams)
        return Forked(conn)

    def close(self) -> None:
        self.proc.stdin.close()  # the host kills what it still runs and ends
        self.proc.wait(30)
        shutil.rmtree(self.folder, ignore_errors=True)


_host: Host | None = None


def _started() -> Host:
    global _host
    if _host is None or _host.proc.poll() is not None:
        _host = Host()
        atexit.register(_host.close)
    return _host


def popen(code: str, *args: str, env: dict[str, str] | None = None) -> Forked:
    """`code` with `args` in a forked child, its stdin and stdout pipes to this process (text), its stderr
    this process's."""
    child_in, to_child = os.pipe()
    from_child, child_out = os.pipe()
    try:
        forked = _started().start(code, args, dict(env or os.environ), os.getcwd(), [child_in, child_out, 2])
    finally:
        os.close(child_in)
        os.close(child_out)
    forked.stdin, forked.stdout = open(to_child, "w"), open(from_child)
    return forked


def run(code: str, *args: str, env: dict[str, str] | None = None, timeout: float) -> subprocess.CompletedProcess:
    """`code` with `args` in a forked child to its end, killed past `timeout`: its status, stdout and stderr."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, open(os.devnull) as null:
        streams = [null.fileno(), out.fileno(), err.fileno()]
        forked = _started().start(code, args, dict(env or os.environ), os.getcwd(), streams)
        try:
            forked.wait(timeout)
        except subprocess.TimeoutExpired:
            forked.kill()
            forked.wait(30)
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(["-c", code, *args], forked.returncode, out.read(), err.read())
