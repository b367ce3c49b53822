"""The store's wire written out byte by byte, for the tests that send frames themselves: numbers, strings,
key lists and the handshake, built here and not with launcher/tcpstore/wire.py's encoders (the tests' own
reading of torch's protocol), and `Raw`, a bare connection that reads exactly what a server answers."""

from __future__ import annotations

import socket
import struct

from launcher.tcpstore.wire import MAGIC

HELLO = b"\x00" + struct.pack("<I", MAGIC)  # VALIDATE with torch's magic number: a connection's first frame


def u64(n: int) -> bytes:
    """A count or a length: 8 bytes, little-endian."""
    return struct.pack("<Q", n)


def s(b: bytes) -> bytes:
    """A string: its length, then its bytes."""
    return u64(len(b)) + b


def keys(*ks: bytes) -> bytes:
    """A list of strings: their count, then each."""
    return u64(len(ks)) + b"".join(s(k) for k in ks)


class Raw:
    """A bare connection that sends frames and reads exactly what the server answers to them."""

    def __init__(self, port: int, hello: bool = True):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.nonce = 0
        if hello:
            self.sock.sendall(HELLO)

    def ask(self, frames: bytes) -> bytes | str:
        """The bytes answered to `frames` (a PING after them marks the end), or "closed"."""
        self.nonce += 1
        mark = struct.pack("<I", 0x5EED0000 + self.nonce)
        self.sock.sendall(frames + b"\x0d" + mark)
        got = b""
        while not got.endswith(mark):
            try:
                chunk = self.sock.recv(1 << 20)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return "closed"
            got += chunk
        return got[:-4]

    def close(self) -> None:
        self.sock.close()
