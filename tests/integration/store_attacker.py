"""Hostile clients of a TCPStore server, for the tests (issue 23): one process, one thread, loopback only.

    python store_attacker.py PORT SECONDS [--idle N] [--slow N] [--trickle N] [--big N] [--nonread N]

Each kind of client is kept at its count for SECONDS (one the server closes is opened again after
REOPEN s), then everything is closed and one JSON line of counts is printed:
  idle     connects and never sends a byte
  slow     sends its VALIDATE, then a SET one byte every SLOW_EVERY s, never finishing it
  trickle  validates, then an open MULTI_GET of 131,072 keys at TRICKLE_RATE bytes/s
  big      validates, then asks MULTI_GET for 100 copies of an 8 MiB value (800 MiB reply), again and again
  nonread  validates, then asks MULTI_GET for 7 copies of the 8 MiB value (56 MiB) and never reads
The 8 MiB value is set once at start under /attack/big (as a well-behaved client would).
"""

from __future__ import annotations

import argparse
import errno
import json
import selectors
import socket
import struct
import time

MAGIC = 0x3C85F7CE
VALIDATE = b"\x00" + struct.pack("<I", MAGIC)
BIG_KEY = b"/attack/big"
REOPEN = 0.5
SLOW_EVERY = 1.0
TRICKLE_RATE = 17_000  # bytes/s per trickling client, as in the reproduction
TICK = 0.05


def s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def multi_get(keys: list[bytes]) -> bytes:
    return b"\x0a" + struct.pack("<Q", len(keys)) + b"".join(s(k) for k in keys)


class Client:
    def __init__(self, kind: str, payload: bytes, rate: float | None):
        self.kind, self.payload, self.rate = kind, payload, rate  # rate: bytes/s; None: all at once
        self.sock: socket.socket | None = None
        self.sent = 0
        self.opened_at = 0.0
        self.reopen_at = 0.0
        self.watched = False  # registered with the selector


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("seconds", type=float)
    for kind in ("idle", "slow", "trickle", "big", "nonread"):
        p.add_argument(f"--{kind}", type=int, default=0)
    args = p.parse_args()
    addr = ("127.0.0.1", args.port)

    setter = socket.create_connection(addr, timeout=30)
    setter.sendall(VALIDATE + b"\x01" + s(BIG_KEY) + s(b"v" * (8 << 20)) + b"\x0d" + struct.pack("<I", 7))
    got = b""
    while len(got) < 4:  # the PING's answer: the SET has landed
        chunk = setter.recv(4)
        if not chunk:
            raise SystemExit("the store closed the setter's connection")
        got += chunk
    setter.close()

    trickle = VALIDATE + multi_get([b"/attack/%07d" % i for i in range(128 << 10)])
    kinds = {
        "idle": (b"", None),
        "slow": (VALIDATE + b"\x01" + s(b"/attack/slow") + s(b"x" * 1000), 1 / SLOW_EVERY),
        "trickle": (trickle, TRICKLE_RATE),
        "big": (VALIDATE + multi_get([BIG_KEY] * 100), None),
        "nonread": (VALIDATE + multi_get([BIG_KEY] * 7), None),
    }
    clients = [Client(k, *kinds[k]) for k in kinds for _ in range(getattr(args, k))]
    counts = {"opened": 0, "closed_by_server": 0, "refused": 0, "connect_errors": 0, "unread_replies": 0}
    sel = selectors.DefaultSelector()
    end = time.monotonic() + args.seconds

    def close(c: Client, by_server: bool) -> None:
        if c.sock is not None:
            if c.watched:
                sel.unregister(c.sock)
            c.sock.close()
            c.sock = None
        counts["closed_by_server"] += by_server
        c.reopen_at = time.monotonic() + REOPEN

    def open_(c: Client, now: float) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        err = sock.connect_ex(addr)
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            counts["connect_errors"] += 1
            c.reopen_at = now + REOPEN
            return
        c.sock, c.sent, c.opened_at = sock, 0, now
        counts["opened"] += 1
        sel.register(sock, selectors.EVENT_READ, c)
        c.watched = True

    try:
        while (now := time.monotonic()) < end:
            for c in clients:
                if c.sock is None:
                    if now >= c.reopen_at:
                        open_(c, now)
                    continue
                due = len(c.payload) if c.rate is None else min(len(c.payload), int((now - c.opened_at) * c.rate))
                if c.kind == "slow":
                    due = min(len(c.payload), len(VALIDATE) + int(now - c.opened_at))
                if due > c.sent:
                    try:
                        c.sent += c.sock.send(memoryview(c.payload)[c.sent : due])
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:
                        close(c, True)
            for key, _ in sel.select(TICK):
                c = key.data
                try:
                    data = c.sock.recv(1 << 16) if c.kind != "nonread" else c.sock.recv(1, socket.MSG_PEEK)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    close(c, True)
                elif data[:4] == b"\xff\xff\xff\xff":
                    counts["refused"] += 1
                    close(c, False)
                elif c.kind == "nonread":  # its reply began: never read, no longer watched (it stays open)
                    sel.unregister(c.sock)
                    c.watched = False
                    counts["unread_replies"] += 1
    finally:
        for c in clients:
            if c.sock is not None:
                close(c, False)
        sel.close()
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
