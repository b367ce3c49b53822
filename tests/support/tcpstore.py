"""TCPStores for the tests: torch's own server in a subprocess (the reference our store answers
like), and what a test may see inside our running StoreServer (which keys a request waits on, so a
test acts once a client's WAIT or WAIT_CHANGE has reached the server instead of sleeping)."""

from __future__ import annotations

import os

import pytest

from support import forks, needs
from support.paths import ROOT

TORCH_SERVER = """
import os, sys
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=sys.argv[1] == "libuv")
print(s.port, flush=True)
sys.stdin.read()
"""
QUIET = {**os.environ, "TORCH_CPP_LOG_LEVEL": "FATAL", "PYTHONPATH": str(ROOT)}  # torch's C++ warnings off


def torch_store_server(kind: str):
    """For a fixture: torch's TCPStore server ("libuv" or "legacy") in a process of its own -> (kind, port),
    killed after. torch runs only in other processes (forked: support/forks.py): its client keeps the GIL
    while it blocks."""
    if needs.MISSING:  # the fork host imports torch; this process need not
        pytest.skip(needs.MISSING)
    p = forks.popen(TORCH_SERVER, kind, env=QUIET)
    try:
        yield kind, int(p.stdout.readline())
    finally:
        p.kill()
        p.wait()


def waiting_on(server, key: str) -> bool:
    """Whether `server` holds a connection waiting for `key` to be set (WAIT, WAIT_CHANGE's change key)
    or to go (WAIT_CHANGE's alive key)."""
    # the clients (torch's and ours) send every key with a leading "/"; a dict lookup from the test's
    # thread while the server's thread writes is atomic under the GIL
    k = ("/" + key).encode()
    return bool(server._waiters.get(k)) or bool(server._gone_waiters.get(k))
