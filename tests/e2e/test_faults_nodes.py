"""Fault injection on real multi-node jobs, nodes lost: an agent killed or frozen, a host cut off
from the others (network namespaces). The helpers and the conventions are test_faults.py's."""

from __future__ import annotations

import os
import signal
import time

import pytest
from support import system
from support.faults import (
    NETNS,
    STEPS,
    assert_rounds_consistent,
    c10d,
    checkpoint,
    first_line_after,
    starts,
    steps_env,
)
from support.launcher_runs import assert_one_story
from support.netns import network_hosts
from support.paths import worker
from support.ports import free_port
from support.processes import sh, wait_for, wait_gone

# ---------------------------------------------------------------------------- agents


def test_agent_sigkill_survivors_reform_without_charging_the_budget(cluster, tmp_path):
    """A SIGKILLed agent's store connections close at once: its neighbour's WAIT_CHANGE on the
    agent's held `alive` key wakes, and the survivors re-form without waiting for the heartbeats."""
    port = free_port()
    env = steps_env(tmp_path, steps=80)
    host = cluster.start(
        *c10d(port, "2:3", "--max_restarts", "0", nproc=2, conf="is_host=true"), STEPS, env=env, name="host"
    )
    others = [
        cluster.start(
            *c10d(port, "2:3", "--max_restarts", "0", nproc=2, conf="is_host=false"), STEPS, env=env, name=f"node{i}"
        )
        for i in (1, 2)
    ]
    for a in (host, *others):  # both workers of each: a line still in a killed agent's pipe is lost with it,
        a.wait_for(r"start rank=\d world=6", count=2)  # and the survivors' are stopped within milliseconds
    victim = others[1]
    victim_workers = victim.workers()
    assert len(victim_workers) == 2
    t0 = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    noticed = first_line_after([host, others[0]], r"membership changed \(node with group rank \d died", t0)
    print(f"\nSIGKILLed agent noticed by a survivor after {noticed:.3f} s")
    assert noticed < 1.5  # the guard's death certificate (benchmark: tens of ms), not the 5 s lease or 6 s heartbeats
    assert victim.wait(10) == -signal.SIGKILL
    assert wait_gone(victim.token, timeout=5) == []  # its guard killed its workers
    host.wait_for(r"start rank=\d world=4 restart=0", timeout=20)
    assert time.monotonic() - t0 < 8
    for a in (host, others[0]):
        assert a.wait(90) == 0, a.stderr[-3000:]
        assert "died (its store session ended)" in a.stderr, a.stderr
        assert {s["restart"] for s in starts(a)} == {"0"}  # membership changes are free: --max_restarts 0 held
    assert_rounds_consistent([host, *others])
    assert checkpoint(tmp_path)["step"] == 80 and checkpoint(tmp_path)["world"] == 4
    assert cluster.leftovers() == {}


@pytest.mark.slow
@pytest.mark.parametrize("then", ["cont", "kill"])
def test_frozen_node_is_dropped_within_liveness_then_rejoins_or_dies_cleanly(cluster, tmp_path, then):
    port = free_port()
    env = steps_env(tmp_path, steps=120)
    host = cluster.start(*c10d(port, "2:3", "--max_restarts", "0", conf="is_host=true"), STEPS, env=env, name="host")
    others = [
        cluster.start(*c10d(port, "2:3", "--max_restarts", "0", conf="is_host=false"), STEPS, env=env, name=f"node{i}")
        for i in (1, 2)
    ]
    for a in others:
        a.wait_for(r"start rank=\d world=3")
    victim = next(a for a in others if starts(a)[-1]["rank"] != "0")  # a stale rank 0 would write checkpoints
    survivor = next(a for a in others if a is not victim)
    frozen = [victim.pid, *victim.workers()]  # the whole node stops: agent and workers (not the guard)
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    noticed = first_line_after(
        [host, survivor], r"membership changed \(node with group rank \d stopped heartbeating", t0
    )
    assert noticed > 5.4, (
        noticed
    )  # a frozen agent's connections stay open: only the heartbeats tell (6 s - one 0.5 s beat)
    for a in (host, survivor):
        a.wait_for(r"start rank=\d world=2 restart=0", timeout=20)
    assert time.monotonic() - t0 < 12, "survivors took longer than the liveness timeout (6 s) + re-forming"
    wait_for(lambda: checkpoint(tmp_path)["world"] == 2, what="the survivors to train on without the frozen node")
    if then == "cont":
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        victim.wait_for(r"start rank=\d world=3", timeout=30)  # it notices the change, rejoins: a new round
        assert victim.wait(90) == 0, victim.stderr[-3000:]
    else:
        victim.signal(signal.SIGKILL)
        assert wait_gone(victim.token, timeout=5) == []  # the guard kills the frozen workers
    for a in (host, survivor):
        assert a.wait(90) == 0, a.stderr[-3000:]
        assert {s["restart"] for s in starts(a)} == {"0"}
    assert_rounds_consistent([host, survivor, victim])
    ck = checkpoint(tmp_path)
    assert ck["step"] == 120 and ck["world"] == (3 if then == "cont" else 2), ck
    assert cluster.leftovers() == {}


# ---------------------------------------------------------------------------- the network


@pytest.fixture
def two_hosts():
    """Hosts a (10.78.0.1) and b (10.78.0.2); yields (a, b, b's link) so a test can cut b off."""
    if not NETNS:
        pytest.skip(system.unless_skipped("needs root and iproute2 for network namespaces"))
    with network_hosts("10.78.0") as hosts:
        yield hosts


def test_partitioned_host_stops_cleanly_and_the_rest_goes_on(cluster, tmp_path, two_hosts):
    a, b, b_link = two_hosts
    port = 29400
    # Long enough that b's workers (they need no peer) are still stepping when b learns it is cut off:
    # on a busy host b's zygote forks them late, from a checkpoint a's workers have taken far already.
    env = steps_env(tmp_path, steps=250)
    cluster.store("10.78.0.1", port, netns=a)
    conf = "is_host=false,read_timeout=3"
    node_a = cluster.start(
        *c10d(port, "1:2", "--max_restarts", "0", conf=conf, host="10.78.0.1"), STEPS, env=env, netns=a, name="a"
    )
    node_b = cluster.start(
        *c10d(port, "1:2", "--max_restarts", "0", conf=conf, host="10.78.0.1"), STEPS, env=env, netns=b, name="b"
    )
    for n in (node_a, node_b):
        n.wait_for(r"start rank=\d world=2")
    sh("ip", "-n", b, "link", "set", b_link, "down")
    t0 = time.monotonic()
    node_a.wait_for(r"start rank=0 world=1 restart=0", timeout=20)  # re-formed alone (elastic 1:2)
    assert time.monotonic() - t0 < 8
    rc_b = node_b.wait(60)
    assert rc_b == 1, node_b.stderr[-3000:]
    assert time.monotonic() - t0 < 40  # bounded by read_timeout, not by TCP's minutes of retries
    assert "rendezvous store" in node_b.stderr and "Traceback" not in node_b.stderr, node_b.stderr
    assert wait_gone(node_b.token, timeout=5) == []  # its workers were stopped with it
    assert node_a.wait(90) == 0, node_a.stderr[-3000:]
    assert checkpoint(tmp_path)["step"] == 250


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fail_rank", [3, 1], ids=["on-the-other-host", "on-the-store-host"])
def test_a_remote_ranks_exception_is_the_root_cause_on_every_host(cluster, two_hosts, fail_rank):
    a, b, _ = two_hosts
    run = c10d(29400, "2", nproc=2, host="10.78.0.1")
    env = {"FAIL_RANK": str(fail_rank), "SLEEP": "60"}
    node_a = cluster.start(*run, worker("raise_rank.py"), env=env, netns=a, name="a")  # hosts the store: its address
    node_b = cluster.start(*run, worker("raise_rank.py"), env=env, netns=b, name="b")
    assert [n.wait(60) for n in (node_a, node_b)] == [1, 1], [n.stderr[-3000:] for n in (node_a, node_b)]
    assert_one_story(
        [node_a.stderr, node_b.stderr], fail_rank, f"RuntimeError: loss is NaN at step 7 on rank {fail_rank}"
    )
    assert cluster.leftovers() == {}
