"""`launcher.net.free_port`: a picked port is held, so that no other pick (of this process or another)
takes it before its server binds it, and the servers it is picked for bind it beside the hold."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys

import pytest
from support.paths import ROOT

from launcher import net
from launcher.tcpstore.server import StoreServer

# Another process's pick, its random draw made to offer the held port first: it must pass it by.
OTHER_PICK = """
import random, sys
from launcher import net
held = int(sys.argv[1])
random.sample = lambda population, k: [held, *[p for p in population if p != held][: k - 1]]
print(net.free_port())
"""


def test_a_picked_port_is_passed_by_another_processes_pick():
    held = net.free_port()
    r = subprocess.run(
        [sys.executable, "-c", OTHER_PICK, str(held)], capture_output=True, text=True, timeout=30, cwd=ROOT, check=True
    )
    assert int(r.stdout) != held
    with socket.socket() as s, pytest.raises(OSError) as e:  # a plain bind, as any other program's
        s.bind(("", held))
    assert e.value.errno == errno.EADDRINUSE


def test_the_launchers_store_binds_and_serves_a_held_port():
    port = net.free_port()
    server = StoreServer("127.0.0.1", port)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        server.close()


def test_a_hold_ends_after_its_time(monkeypatch):
    monkeypatch.setattr(net, "HOLD_S", 0.0)
    first = net.free_port()
    net.free_port()  # each pick first lets go of the holds whose time has passed
    with socket.socket() as s:
        s.bind(("", first))


def test_release_keeps_only_the_port_asked_for():
    kept, let_go = net.free_port(), net.free_port()
    net.release_holds(keep=kept)
    with socket.socket() as s:
        s.bind(("", let_go))
    with socket.socket() as s, pytest.raises(OSError):
        s.bind(("", kept))
    net.release_holds()
    with socket.socket() as s:
        s.bind(("", kept))
