"""Fault injection on real multi-node jobs, the rendezvous store lost: killed, frozen, restarted,
its connections cut again and again. The helpers and the conventions are test_faults.py's."""

from __future__ import annotations

import re
import signal
import time

import pytest
from support.faults import (
    STEPS,
    assert_rounds_consistent,
    c10d,
    checkpoint,
    starts,
    steps_env,
    wait_checkpoint,
)
from support.ports import free_port
from support.relay import Relay

# ---------------------------------------------------------------------------- the rendezvous store


# A frozen store resumed as the rerun starts may still hold the dead run's alive keys for a moment: a
# rerun node that looks then waits as a spare of the dead run, and ends its round once the keys are gone
# (spares.SpareSeat.wait; tests/integration/test_spares_all_gone.py makes that moment long).
@pytest.mark.parametrize("fault", ["kill", "freeze"])
def test_store_lost_every_node_fails_cleanly_then_a_rerun_resumes(cluster, tmp_path, fault):
    """c10d has no second copy of the store: losing it ends the job on every node, promptly, with a
    clear message and exit 1, workers stopped; a rerun on a restarted store resumes from the checkpoint."""
    port, steps = free_port(), 60 if fault == "kill" else 200  # a frozen store is noticed after 2 + 5 s
    env = steps_env(tmp_path, steps=steps)
    store = cluster.store("127.0.0.1", port)
    args = c10d(port, "2", "--max_restarts", "3", conf="is_host=false,read_timeout=2")
    agents = [cluster.start(*args, STEPS, env=env, name=f"node{i}") for i in range(2)]
    wait_checkpoint(tmp_path, 5)
    t0 = time.monotonic()
    store.signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    for a in agents:
        assert a.wait(60) == 1, a.stderr[-3000:]
        assert "reason: rendezvous store at 127.0.0.1:" in a.stderr and "Traceback" not in a.stderr, a.stderr
    assert time.monotonic() - t0 < (10 if fault == "kill" else 35)  # read_timeout 2 s + 5 s per exchange
    assert {a.name for a in agents} & set(cluster.leftovers(timeout=5)) == set()
    step = checkpoint(tmp_path)["step"]
    assert 0 < step < steps
    if fault == "kill":
        store.wait(10)
        store = cluster.store("127.0.0.1", port)  # a fresh, empty store on the same port
    else:
        store.signal(signal.SIGCONT)  # the same store, with the dead run's keys still in it
    env["STEP_TIME"] = "0.02"
    again = [cluster.start(*args, STEPS, env=env, name=f"again{i}") for i in range(2)]
    for a in again:
        assert a.wait(90) == 0, a.stderr[-3000:]
    assert min(int(s["from"]) for a in again for s in starts(a)) >= step
    assert checkpoint(tmp_path)["step"] == steps


@pytest.fixture
def relayed_store(cluster):
    """A standalone store behind a relay whose connections a test cuts -> (store agent, store port, relay)."""
    port = free_port()
    store = cluster.store("127.0.0.1", port)
    relay = Relay(("127.0.0.1", port))
    yield store, port, relay
    relay.close()


def test_store_connections_cut_again_and_again_the_job_rides_it_out(cluster, tmp_path, relayed_store):
    """Every agent's store connections are cut (FIN, then RST, in turn) every 0.25 s from the
    rendezvous to the end, watchers in WAIT_CHANGE included: each agent reconnects in its session,
    so no node is declared dead (a fixed-size job would close), no restart is charged, every
    worker finishes."""
    _, _, relay = relayed_store
    env = steps_env(tmp_path, steps=50, step_time=0.05)
    args = c10d(relay.port, "3", "--max_restarts", "0", conf="is_host=false")
    agents = [cluster.start(*args, STEPS, env=env, name=f"node{i}") for i in range(3)]
    cuts, deadline = 0, time.monotonic() + 60
    while any(a.popen.poll() is None for a in agents) and time.monotonic() < deadline:
        time.sleep(0.25)
        cuts += relay.cut(rst=cuts % 2 == 1) > 0
    for a in agents:
        assert a.wait(10) == 0, a.stderr[-3000:]
        assert not re.search(r"died|stopped heartbeating|membership changed|lost the rendezvous store", a.stderr), (
            a.stderr
        )
        assert {s["restart"] for s in starts(a)} == {"0"} and {s["round"] for s in starts(a)} == {"0"}, starts(a)
    said = sum(a.stderr.count("reconnected to the store at") for a in agents)
    print(f"\n{cuts} cuts, {relay.accepted} connections through the relay, {said} reconnects logged")
    assert cuts >= 8 and said >= cuts, (cuts, said)
    assert_rounds_consistent(agents)
    assert checkpoint(tmp_path)["step"] == 50
    assert {a.name for a in agents} & set(cluster.leftovers(timeout=5)) == set()


@pytest.mark.timeout(90)
def test_a_restarted_store_ends_the_job_with_a_clear_line(cluster, tmp_path, relayed_store):
    """The store killed and started again on its port while the agents reconnect (through a relay,
    as a socket-activated service would queue them): the new, empty store is not the one the job
    began on, and every node ends saying so, its workers stopped."""
    store, port, relay = relayed_store
    env = steps_env(tmp_path, steps=200)
    args = c10d(relay.port, "2", "--max_restarts", "3", conf="is_host=false")
    agents = [cluster.start(*args, STEPS, env=env, name=f"node{i}") for i in range(2)]
    wait_checkpoint(tmp_path, 3)
    store.signal(signal.SIGKILL)
    store.wait(10)
    t0 = time.monotonic()
    cluster.store("127.0.0.1", port)
    for a in agents:
        assert a.wait(30) == 1, a.stderr[-3000:]
        assert "the rendezvous store restarted and lost the job's state" in a.stderr, a.stderr
        assert "Traceback" not in a.stderr, a.stderr
    assert time.monotonic() - t0 < 15
    assert {a.name for a in agents} & set(cluster.leftovers(timeout=5)) == set()
