"""The store's death rule with real agent-like processes (issue 32 items 3 and 7): a lost connection is
no death for the session's lease (tcpstore.GRACE, 5 s) however slow the reconnect; a dead agent is
told at once by its guard's death certificate (END_SESSION); a held key is removed by no other
session, and only its session's end is a death to a WAIT_CHANGE.

Each "agent" is a subprocess that does what the c10d backend does: a TCPStoreAdapter (it reconnects
in its session), an alive key held, and, as run.py does, a guard process given the adapter's last will.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from support.paths import ROOT
from support.processes import wait_for
from support.relay import Relay

from launcher.tcpstore import GONE, StoreClient, StoreError
from launcher.tcpstore.ops import GRACE

pytestmark = pytest.mark.timeout(60)

AGENT = """
import sys, time
from launcher.agent import process
from launcher.rendezvous.c10d import TCPStoreAdapter
guard = process.Guard("test-" + sys.argv[3]).start()
store = TCPStoreAdapter("127.0.0.1", int(sys.argv[1]), 5)
will = store.last_will()
guard.will(will.host, will.port, will.payload, will.answer)
store.client.hold(sys.argv[2], b"1")
print(guard.pid, flush=True)
while True:  # as an agent's watcher: always one request out, so a cut is found at once
    store.client.wait([sys.argv[2] + "/never"], 0.5)
"""


@pytest.fixture
def agents():
    """Starts agent processes -> (popen, guard pid); kills both at the end."""
    made: list[tuple[subprocess.Popen, int]] = []

    def start(port: int, key: str) -> tuple[subprocess.Popen, int]:
        p = subprocess.Popen(
            [sys.executable, "-c", AGENT, str(port), key, uuid.uuid4().hex],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        made.append((p, 0))
        line = p.stdout.readline()
        assert line.strip().isdigit(), p.stderr.read() if p.poll() is not None else line
        made[-1] = (p, int(line))
        return made[-1]

    yield start
    for p, guard in made:
        for pid in (p.pid, guard):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        p.wait(10)


def watch(client: StoreClient, alive: str, stop: threading.Event) -> list:
    """A neighbour's watcher in a thread: WAIT_CHANGE on `alive`, 0.5 s at a time, until GONE or `stop`;
    the list gets (GONE, when) once it saw the key go."""
    seen: list = []

    def run():
        try:
            while not stop.is_set():
                if client.wait_change(alive + "change", alive, 0.5) == GONE:
                    seen.append((GONE, time.monotonic()))
                    return
        except StoreError as e:  # closed by the test at its end; anything else fails the test
            if not stop.is_set():
                seen.append((e, time.monotonic()))

    threading.Thread(target=run, daemon=True).start()
    return seen


def test_a_connection_lost_for_3_s_is_no_death(server, agents):
    """All the agent's connections cut, and every new one closed at once for 3 s (a slow reconnect):
    the session and its key outlive it, the neighbour's WAIT_CHANGE never says GONE."""
    relay = Relay(("127.0.0.1", server.port))
    stop = threading.Event()
    try:
        key = f"{uuid.uuid4().hex[:8]}/alive"
        agent, _ = agents(relay.port, key)
        neighbour = StoreClient("127.0.0.1", server.port, timeout=5, session=uuid.uuid4().int >> 65)
        seen = watch(neighbour, key, stop)
        for _ in range(2):
            relay.refuse = True
            assert relay.cut(rst=True) >= 1
            cut_at = time.monotonic()
            wait_for(lambda at=cut_at: time.monotonic() - at >= 3.0, timeout=5, what="3 s without the store")
            relay.refuse = False
            before = relay.accepted
            wait_for(lambda n=before: relay.accepted > n, timeout=5, what="the agent to reconnect")
            assert neighbour.check([key]) and not seen, seen
            assert agent.poll() is None
        stop.set()
    finally:
        stop.set()
        relay.close()


def test_a_killed_agent_is_told_by_its_guard_at_once(server, agents):
    """SIGKILL: the guard sends the death certificate, the key goes well before the lease would end it."""
    key = f"{uuid.uuid4().hex[:8]}/alive"
    agent, _ = agents(server.port, key)
    neighbour = StoreClient("127.0.0.1", server.port, timeout=5, session=uuid.uuid4().int >> 65)
    stop = threading.Event()
    seen = watch(neighbour, key, stop)
    t0 = time.monotonic()
    agent.kill()
    wait_for(lambda: seen, timeout=GRACE - 1, what="the neighbour to see the key go before the lease ends")
    stop.set()
    assert seen[0][0] == GONE, seen
    print(f"\nSIGKILLed agent's key gone after {seen[0][1] - t0:.3f} s (lease {GRACE:g} s)")
    assert not neighbour.check([key])


def test_an_agent_killed_with_its_guard_is_dead_at_the_end_of_the_lease(server, agents):
    """No guard left to tell (the whole process group killed, say): the lease ends it, not sooner."""
    key = f"{uuid.uuid4().hex[:8]}/alive"
    agent, guard = agents(server.port, key)
    neighbour = StoreClient("127.0.0.1", server.port, timeout=5, session=uuid.uuid4().int >> 65)
    stop = threading.Event()
    seen = watch(neighbour, key, stop)
    os.kill(guard, signal.SIGKILL)
    wait_for(lambda: agent.poll() is not None or _reaped(guard), timeout=5, what="the guard to die")
    t0 = time.monotonic()
    agent.kill()
    wait_for(lambda: seen, timeout=GRACE + 5, what="the lease to end")
    stop.set()
    assert seen[0][0] == GONE, seen
    assert seen[0][1] - t0 >= GRACE - 0.5, seen[0][1] - t0


def _reaped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] in "ZX"
    except FileNotFoundError:
        return True


def test_another_session_cannot_delete_a_held_key_and_its_holder_deleting_it_is_no_death(server):
    key = f"{uuid.uuid4().hex[:8]}/alive"
    holder = StoreClient("127.0.0.1", server.port, timeout=5, session=71, reconnect=5)
    stranger = StoreClient("127.0.0.1", server.port, timeout=5)  # torch's client: no session
    other = StoreClient("127.0.0.1", server.port, timeout=5, session=72, reconnect=5)
    neighbour = StoreClient("127.0.0.1", server.port, timeout=5, session=uuid.uuid4().int >> 65)
    try:
        holder.hold(key, b"1")
        assert not stranger.delete_key(key) and not other.delete_key(key)
        assert neighbour.check([key])
        assert holder.delete_key(key)  # its own (old rounds' keys are tidied so): deleted, but no death
        assert neighbour.wait_change(key + "change", key, 1.0) is None  # the wait's timeout, not GONE
        stranger.set(key, b"1")  # an unheld key of that name: anyone may delete it, and it is no death
        assert stranger.delete_key(key)
        assert neighbour.wait_change(key + "change", key, 1.0) is None
        holder.hold(key, b"1")
        stop = threading.Event()
        seen = watch(neighbour, key, stop)
        assert holder.end_session()  # the agent leaves: its session's end is told at once
        wait_for(lambda: seen, timeout=2, what="GONE after END_SESSION")
        stop.set()
    finally:
        for c in (holder, stranger, other, neighbour):
            c.close()
