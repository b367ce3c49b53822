"""accounting.Accountant fed the supervisor's events (injected clock, real progress files) and the
job-wide figure agreed over an in-memory store."""

import json
import os

import pytest

from launcher.telemetry.accounting import Accountant, goodput_line, job_breakdown
from launcher.telemetry.goodput import Breakdown, Component, total

approx = pytest.approx


class DictStore:
    """get, set, multi_get and a wait that never blocks (every key is there or it times out at once)."""

    def __init__(self):
        self.data: dict[str, bytes] = {}

    def get(self, key):
        return self.data.get(key)

    def set(self, key, value):
        self.data[key] = value

    def multi_get(self, keys):
        return [self.data.get(k) for k in keys]

    def wait(self, keys, timeout):
        return all(k in self.data for k in keys)


def test_the_accountant_hears_a_failure_and_reads_the_steps(tmp_path):
    now = [100.0]
    files = {0: tmp_path / "p0"}
    acc = Accountant(lambda: [(r, str(p)) for r, p in files.items()], clock=lambda: now[0])

    def step(n: int, at: float) -> None:
        now[0] = at
        files[0].write_text(f"{n:20d}\n")
        os.utime(files[0], (at, at))
        acc.tick()

    acc("rendezvous", {"cause": "start"})
    now[0] = 101.0
    acc("spawn", {"rank": 0})
    acc("running", {"round": 0, "restarts": 0, "group_rank": 0, "group_world_size": 1})
    for n in range(1, 11):  # step n at 101 + n
        step(n, 101.0 + n)
    now[0] = 111.5
    acc("exit", {"rank": 0, "returncode": 1, "collateral": False})
    acc("stopping", {"reason": "restart"})
    acc("rendezvous", {"cause": "failure"})
    now[0] = 112.0
    acc("spawn", {"rank": 0})
    acc("running", {"round": 1, "restarts": 1, "group_rank": 0, "group_world_size": 1})
    for n in range(6, 13):  # resumed from 5: step n at 107 + n (the first at 113)
        step(n, 107.0 + n)
    acc("exit", {"rank": 0, "returncode": 0, "collateral": False})
    now[0] = 120.0
    b = acc.finish()
    assert (b.restarts, b.redone_steps, b.wall) == (1, 5, 20.0)
    assert (b.startup, b.restart, b.redone) == (1.0, 113.0 - 111.5, 5.0)
    assert b.training == (111.5 - 102.0) + (119.0 - 113.0) - 5.0
    assert b.rendezvous == 1.0 + 1.0  # forming, and the end after the workers succeeded
    assert acc.round == (1, 0, 1)


def test_group_rank_0_sums_and_the_others_read_the_same_figure():
    store = DictStore()
    mine = [Breakdown(wall=10.0, training=8.0, restart=2.0), Breakdown(wall=12.0, training=9.0, restart=3.0)]
    store.set("job/r3/goodput1", json.dumps(mine[1].to_dict()).encode())
    job0, why0 = job_breakdown(store, "job", (3, 0, 2), mine[0], wait=0)
    job1, why1 = job_breakdown(store, "job", (3, 1, 2), mine[1], wait=0)
    assert job0 == job1 == total(mine).rounded() and why0 == why1 == ""
    assert "(job-wide, 2 nodes; this node 80.0 %)" in goodput_line(mine[0], job0)


def test_without_the_job_figure_a_node_says_why():
    node = Breakdown(wall=10.0, training=8.0)
    job, why = job_breakdown(DictStore(), "job", (3, 1, 2), node, wait=0)
    assert job is None and "group rank 0" in why
    assert goodput_line(node, job, why).endswith(f"(this node; the job's figure is unknown: {why})")
    assert job_breakdown(None, "job", (0, 0, 1), node) == (node, "")
    assert job_breakdown(None, "job", None, node)[0] is None


def replay(acc: Accountant, now: list[float], script: list[tuple[float, str, dict]]) -> None:
    for at, kind, fields in script:
        now[0] = at
        acc.tick()
        acc(kind, fields)


DEMO = [  # scripts/demo.sh's events file (--preload, no progress(), rank 1 killed), times from its start
    (0.000, "rendezvous", {"cause": "start"}),
    (0.003, "starting", {"round": 0, "restarts": 0}),
    (2.180, "spawn", {"rank": 0}),
    (2.214, "spawn", {"rank": 1}),
    (2.215, "running", {"round": 0, "restarts": 0, "group_rank": 0, "group_world_size": 1}),
    (2.543, "exit", {"rank": 1, "returncode": -9, "collateral": False}),
    (2.544, "stopping", {"reason": "restart"}),
    (2.553, "exit", {"rank": 0, "returncode": -15, "collateral": True}),
    (2.554, "rendezvous", {"cause": "failure"}),
    (2.554, "starting", {"round": 1, "restarts": 1}),
    (2.574, "spawn", {"rank": 0}),
    (2.596, "spawn", {"rank": 1}),
    (2.596, "running", {"round": 1, "restarts": 1, "group_rank": 0, "group_world_size": 1}),
    (3.822, "exit", {"rank": 0, "returncode": 0, "collateral": False}),
    (3.836, "exit", {"rank": 1, "returncode": 0, "collateral": False}),
]


def test_the_demo_books_the_preload_import_as_start_up_and_its_restart_to_the_workers_start():
    now = [0.0]
    acc = Accountant(lambda: [(0, None), (1, None)], clock=lambda: now[0])
    replay(acc, now, DEMO)
    now[0] = 3.870
    b = acc.finish()
    assert b.startup == approx(2.215 - 0.003) and b.rendezvous == approx(0.003 + 3.870 - 3.836)
    assert b.restart == approx(2.596 - 2.543) and b.restart <= 0.5 and b.restarts == 1
    assert b.training == approx((2.543 - 2.215) + (3.836 - 2.596)) and not b.steps_known
    assert sum(b.seconds(c) for c in Component) == approx(b.wall)


def test_sigterm_in_a_restarted_job_is_its_shutdown():
    now = [0.0]
    acc = Accountant(lambda: [(0, None)], clock=lambda: now[0])
    script = [e for e in DEMO if e[0] <= 2.596]
    script += [
        (3.000, "signal", {"name": "SIGUSR1", "passthrough": True}),  # passed to the workers: nothing stops
        (3.500, "signal", {"name": "SIGTERM", "passthrough": False}),
        (3.501, "stopping", {"reason": "signal"}),
        (3.600, "exit", {"rank": 0, "returncode": -15, "collateral": True}),
        (3.610, "exit", {"rank": 1, "returncode": -15, "collateral": True}),
    ]
    replay(acc, now, script)
    now[0] = 3.700
    b = acc.finish()
    assert (b.shutdown, b.rendezvous, b.restarts) == (approx(0.2), approx(0.003), 1)
    assert b.training == approx((2.543 - 2.215) + (3.5 - 2.596))
    assert sum(b.seconds(c) for c in Component) == approx(b.wall)


def test_a_job_closed_by_another_node_is_shutdown():
    now = [0.0]
    acc = Accountant(lambda: [(0, None)], clock=lambda: now[0])
    replay(acc, now, [e for e in DEMO if e[0] <= 2.215])
    replay(acc, now, [(5.0, "membership", {"reason": "closed"}), (5.0, "stopping", {"reason": "closed"})])
    now[0] = 6.0
    b = acc.finish()
    assert (b.shutdown, b.restart, b.restarts) == (approx(1.0), 0.0, 0)


def test_launcher_status_leaves_a_spare_standing_by_out_of_the_jobs_figure():
    from launcher.cli.status import job_goodput
    from launcher.rendezvous.keys import Keys
    from launcher.telemetry.reports import NodeReport

    def node(b: Breakdown) -> NodeReport:
        return NodeReport("h", "running", 0, 0, 3, goodput=b)

    member, spare = Breakdown(wall=10.0, training=9.0, rendezvous=1.0), Breakdown(standby=8.0)
    job = job_goodput(DictStore(), Keys("j"), 0, [node(member), node(member), node(spare)])
    assert (job["nodes"], job["goodput"], job["final"]) == (2, 0.9, False), job
