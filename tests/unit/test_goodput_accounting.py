"""accounting.Accountant fed the supervisor's events (injected clock, real progress files) and the
job-wide figure agreed over an in-memory store."""

import json
import os

from launcher.telemetry.accounting import Accountant, goodput_line, job_breakdown
from launcher.telemetry.goodput import Breakdown, total


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
