"""Free loopback ports."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port free right now (the tests' own copy: no launcher module needed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
