"""Soak: a two-node c10d job whose rank 0 fails about every second for 40 s (SOAK_SECONDS to
change it), restarted every time. The agents must not grow: file descriptors, threads and memory
are sampled once the job is warm and again near the end; the store must not gather keys round
after round; nothing may be left running afterwards."""

from __future__ import annotations

import os
import re
import time

import psutil
import pytest
from support.launcher_runs import Cluster, c10d
from support.paths import worker
from support.ports import free_port

pytestmark = pytest.mark.slow
SECONDS = float(os.environ.get("SOAK_SECONDS", "40"))  # ~20 rounds measured: a leak per round shows
RUN_ID = "soak"


def sample(pid: int, seconds: float = 3.0) -> dict:
    """The agent's fds and threads at their highest over `seconds` (a round or two: mid-round a
    node holds its store connections and its workers' pipes; between rounds a few are closed and
    reopened, so a single sample swings by half a dozen fds), and its RSS."""
    p = psutil.Process(pid)
    fds, threads, deadline = [], [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        fds.append(p.num_fds())
        threads.append(p.num_threads())
        time.sleep(0.1)
    return {"fds": max(fds), "threads": max(threads), "rss": p.memory_info().rss}


def current_round(agent) -> int:
    rounds = [int(m) for m in re.findall(r"round (\d+) \(restart", agent.stderr)]
    return max(rounds, default=0)


PER_NODE = ("node1", "node2", "plan1", "plan2", "hb0", "hb1")  # what two nodes write in a round
# One of each per round, at most: `cause` says why a failed round ended (the restart policy), `dead`
# counts the tickets and spares found dead (read with add(0), so every round that counts it has one).
MARKERS = ("joined", "sealed", "change", "failed", "cause", "left", "waiting", "dead", "finished")


def store_keys(port: int, old_round: int = -1) -> tuple[int, int, list[str]]:
    """(keys in the store, the job's round, the per-node keys of `old_round` still there)."""
    from launcher.rendezvous.c10d import TCPStoreAdapter

    st = TCPStoreAdapter("127.0.0.1", port, 10, connect_timeout=10)
    try:
        left = [k for k in PER_NODE if old_round >= 0 and st.get(f"{RUN_ID}/r{old_round}/{k}") is not None]
        return st.client.num_keys(), int(st.get(f"{RUN_ID}/round") or 0), left
    finally:
        st.close()


def wait_round(agent, at_least: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while current_round(agent) < at_least:
        assert agent.popen.poll() is None, agent.stderr[-3000:]
        assert time.monotonic() < deadline, f"round {at_least} never came\n{agent.stderr[-3000:]}"
        time.sleep(0.2)


def test_restart_every_second_for_40_s_nothing_grows():
    cluster = Cluster()
    try:
        port = free_port()
        until = time.time() + SECONDS
        env = {"FAIL_EVERY": "1", "SOAK_UNTIL": str(until)}

        # The restart policy off (docs/policy.md): no backoff, no quarantine, no stop for the same
        # failure again and again, or the node would be held back or leave with 69 after 3 rounds.
        policy = ("--restart_policy", "backoff=0,deterministic=off,no_progress=0", "--quarantine", "window=0")

        def args(host: str) -> list[str]:
            conf = f"read_timeout=20,is_host={host}"
            return c10d(port, "2", "--max_restarts", "10000", *policy, run_id=RUN_ID, conf=conf)

        host = cluster.start(*args("true"), worker("steps.py"), env=env, name="host")
        other = cluster.start(*args("false"), worker("steps.py"), env=env, name="other")
        agents = (host, other)

        wait_round(host, 5, timeout=60)  # warm: every thread and buffer made once
        first = {a.name: sample(a.pid) for a in agents}
        keys0, round0, _ = store_keys(port)
        # The store is read first, then the two samples (3 s each): all before the job ends at `until`.
        while time.time() < until - 10:
            assert host.popen.poll() is None, host.stderr[-3000:]
            time.sleep(0.5)
        keys1, round1, stale = store_keys(port, old_round=round0 + 1)
        last = {a.name: sample(a.pid) for a in agents}

        for a in agents:
            assert a.wait(60) == 0, a.stderr[-3000:]
        rounds = round1 - round0
        assert rounds >= 10, (round0, round1)  # it really restarted all the time
        report = {n: {k: (first[n][k], last[n][k]) for k in first[n]} for n in first}
        print(f"\nsoak: rounds {round0}->{round1}, store keys {keys0}->{keys1}, agents {report}")
        for name in first:
            # a leak grows with every round (tens of them here); the peaks drift by a socket or two at most
            assert last[name]["fds"] - first[name]["fds"] <= 3, report
            assert last[name]["threads"] - first[name]["threads"] <= 2, report
            assert last[name]["rss"] - first[name]["rss"] <= 16 << 20, report  # allocator noise, not per round
        # The per-node keys of old rounds are deleted as the job moves on; each round leaves only its
        # counters and markers (for nodes that wake up late), a constant number whatever the size.
        assert stale == [], stale
        assert (keys1 - keys0) / rounds <= len(MARKERS), (keys0, keys1, rounds)
        assert cluster.leftovers() == {}
    finally:
        cluster.cleanup()
