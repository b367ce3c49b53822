"""Hostile data in a real store: keys under the job's prefix that the protocol did not write
(garbage, wrong types, huge or oversized values, a rogue sealer's plan) must be rejected or
survived, never crash a node or hang it. Each node is an ElasticRendezvous in a thread."""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
import time

import pytest
from support.rendezvous import SETTINGS, agents, client

from launcher.errors import LauncherError, RendezvousError
from launcher.rendezvous.api import Cause
from launcher.rendezvous.protocol import ElasticRendezvous
from launcher.rendezvous.records import MAX_VALUE
from launcher.spec import Round


def join(rdzvs: list[ElasticRendezvous], timeout: float = 40) -> list[object]:
    """Every node asks for its first round at once; each gets a Round or the exception it raised."""
    results: list[object] = [None] * len(rdzvs)

    def ask(i: int) -> None:
        try:
            results[i] = rdzvs[i].next_round(Cause.START)
        except BaseException as e:  # noqa: BLE001 - the test sorts clean errors from crashes
            results[i] = e

    threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(len(rdzvs))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a node hung on hostile store data"
    return results


def sane(result: object) -> None:
    """A Round whose every field has its proper type and range, or a clean launcher error."""
    if isinstance(result, LauncherError):
        assert str(result) and len(str(result)) < 1000, str(result)[:200]
        return
    assert isinstance(result, Round), f"crashed: {type(result).__name__}: {result}"
    for name in (
        "round",
        "restart_count",
        "group_rank",
        "group_world_size",
        "rank_offset",
        "world_size",
        "master_port",
    ):
        v = getattr(result, name)
        assert type(v) is int and 0 <= v < 1 << 31, (name, v)
    assert 0 <= result.group_rank < result.group_world_size and 0 < result.master_port < 65536
    assert type(result.master_addr) is str and 0 < len(result.master_addr) <= 255


def formed(results: list[object], nodes: int) -> None:
    """Every real node got a round with all of them in it (2 workers each), with distinct group ranks."""
    for r in results:
        sane(r)
        assert isinstance(r, Round), r
    assert sorted(r.group_rank for r in results) == list(range(nodes))
    assert {r.world_size for r in results} == {2 * nodes}


GARBAGE = [b"\xff\xfe\x00 garbage", b"-1", b"9" * 40, b"x" * (1 << 20)]


@pytest.mark.parametrize("key", ["round", "closed", "restarts", "token", "r0/joined", "r0/sealed", "r0/change"])
@pytest.mark.parametrize("garbage", GARBAGE, ids=["binary", "negative", "huge-number", "1MiB"])
def test_garbage_under_the_job_prefix_never_crashes_a_node(store_port, key, garbage):
    client(store_port).set(f"job/{key}", garbage)
    # A round or a clean error both pass: a garbled counter may hold the nodes until the join timeout,
    # 3 s here, not the module's 10 (28 cases; 10 s each was over a minute of the suite's wall time).
    results = join(agents(store_port, 2, 2, 2, settings=dataclasses.replace(SETTINGS, join_timeout=3)))
    for r in results:
        sane(r)  # a round, or one clear error (the job cannot go on with its own counters garbled)


DESCRIPTORS = {
    "not-json": b"{nope",
    "oversized": json.dumps({"id": "x", "addr": "1.2.3.4", "port": 1, "nproc": 1, "pad": "x" * MAX_VALUE}).encode(),
    "a-list": b"[1, 2, 3]",
    "nproc-string": json.dumps({"id": "x", "addr": "1.2.3.4", "port": 1, "nproc": "2", "prev": -1}).encode(),
    "nproc-huge": json.dumps({"id": "x", "addr": "1.2.3.4", "port": 1, "nproc": 2**40, "prev": -1}).encode(),
    "nproc-negative": json.dumps({"id": "x", "addr": "1.2.3.4", "port": 1, "nproc": -3, "prev": -1}).encode(),
    "addr-number": json.dumps({"id": "x", "addr": 123, "port": 1, "nproc": 1, "prev": -1}).encode(),
    "addr-huge": json.dumps({"id": "x", "addr": "a" * 60000, "port": 1, "nproc": 1, "prev": -1}).encode(),
    "port-string": json.dumps({"id": "x", "addr": "1.2.3.4", "port": "x", "nproc": 1, "prev": -1}).encode(),
    "port-out-of-range": json.dumps({"id": "x", "addr": "1.2.3.4", "port": 70000, "nproc": 1, "prev": -1}).encode(),
    "prev-bool": json.dumps({"id": "x", "addr": "1.2.3.4", "port": 1, "nproc": 1, "prev": True}).encode(),
    "fields-missing": json.dumps({"id": "x"}).encode(),
    "never-written": None,  # a node that took a ticket and died before writing its entry
    "nested-30000-deep": b"[" * 30000 + b"]" * 30000,  # json recurses per level: a RecursionError once
}


@pytest.mark.parametrize("nnodes", [(2, 3), (2, 2)], ids=["elastic", "fixed"])
@pytest.mark.parametrize("what", list(DESCRIPTORS))
def test_a_malformed_node_entry_is_left_out_and_the_real_nodes_form(store_port, what, nnodes):
    hostile = client(store_port)
    ticket = hostile.add("job/r0/joined", 1)  # first in line: the real nodes come after it
    if DESCRIPTORS[what] is not None:
        hostile.set(f"job/r0/node{ticket}", DESCRIPTORS[what])
    formed(join(agents(store_port, 2, *nnodes)), nodes=2)


@pytest.mark.parametrize(
    "plan",
    [
        {
            "group_rank": "0",
            "group_world_size": 2,
            "rank_offset": 0,
            "world_size": 4,
            "master_addr": "h",
            "master_port": 1,
            "restarts": 0,
        },
        {
            "group_rank": 0,
            "group_world_size": 2,
            "rank_offset": 0,
            "world_size": 4,
            "master_addr": ["h"],
            "master_port": 1,
            "restarts": 0,
        },
        {
            "group_rank": 5,
            "group_world_size": 2,
            "rank_offset": 0,
            "world_size": 4,
            "master_addr": "h",
            "master_port": 1,
            "restarts": 0,
        },
        {"group_rank": 0},
        "not a plan",
    ],
    ids=["rank-string", "addr-list", "rank-out-of-range", "fields-missing", "a-string"],
)
def test_a_hostile_sealer_with_a_malformed_plan_is_a_clean_error(store_port, plan):
    """A rogue client joins as the second node, seals the round and writes the first node a bad plan."""
    [real] = agents(store_port, 1, 2, 2)
    results: list[object] = []
    t = threading.Thread(target=lambda: results.extend(join([real])), daemon=True)
    t.start()
    rogue = client(store_port)
    assert rogue.wait(["job/r0/node1"], 20)  # the real node has its ticket and its entry
    k = rogue.add("job/r0/joined", 1)
    rogue.set(
        f"job/r0/node{k}", json.dumps({"id": "rogue", "addr": "10.0.0.9", "port": 5, "nproc": 2, "prev": -1}).encode()
    )
    rogue.compare_set("job/r0/sealed", b"", f"{k}:rogue".encode())
    rogue.set("job/r0/plan1", json.dumps(plan).encode())
    t.join(30)
    assert len(results) == 1
    sane(results[0])
    assert isinstance(results[0], RendezvousError), results[0]


def test_garbage_under_another_run_id_does_not_matter(store_port):
    hostile = client(store_port)
    for key in ("round", "closed", "restarts", "r0/joined", "r0/sealed", "r0/node1", "r0/plan1"):
        for other in ("jobX", "jo", "job/r0"):  # other runs, also ones whose keys start like ours
            hostile.set(f"{other}/{key}", b"\xffgarbage")
    formed(join(agents(store_port, 2, 2, 2)), nodes=2)


def test_a_closed_job_with_a_hostile_verdict_and_reason_is_one_printable_error(store_port):
    """A forged close: a 30,000-deep verdict and a reason with a newline and a clear-screen sequence."""
    rogue = client(store_port)
    rogue.set("job/verdict", b"[" * 30000 + b"]" * 30000)
    rogue.set("job/closed", b"it finished\n\x1b[2Jlauncher: job succeeded")
    [result] = join(agents(store_port, 1, 1, 1))
    assert isinstance(result, RendezvousError), result
    assert str(result) == "the job was closed: it finished  [2Jlauncher: job succeeded"
    assert getattr(result, "verdict", None) is None


def test_a_heartbeat_counter_that_holds_no_number_is_named_not_blamed_on_the_store(store_port):
    """Our server hangs up on an ADD to a value that is no number (as torch's does): the watcher
    reads the value back and names it, instead of reporting a lost store."""
    nodes = agents(store_port, 2, 2, 2)
    rounds = join(nodes)
    formed(rounds, nodes=2)
    posted: queue.Queue = queue.Queue()
    client(store_port).set("job/r0/hb0", b"not a number")
    watcher = next(n for n, r in zip(nodes, rounds) if r.group_rank == 0)
    watcher.watch(rounds[nodes.index(watcher)], posted.put)
    try:
        change = posted.get(timeout=30)
    finally:
        for n in nodes:
            n.shutdown(succeeded=True)
    assert "holds 'not a number', not a number" in change.reason, change
    assert "lost the rendezvous store" not in change.reason
