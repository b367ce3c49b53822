"""The job board (launcher/telemetry/board.py) and the node reports (launcher/telemetry/reports.py) in one process: a
report read back is bounded and checked, the monitor's ticks cost O(N) store operations per interval,
the one straggler judge flags and clears through the board (or alone without a store), and a node's
last report outlives its thread. Ticks are driven by hand, the judge's clock is a fake one."""

from __future__ import annotations

import json

import pytest
from support.clock import FakeClock

from launcher.rendezvous.records import MAX_VALUE
from launcher.rendezvous.store import Capability
from launcher.spec import Round
from launcher.telemetry.board import REPORT_EVERY, RETRY_EVERY, Board, Monitor
from launcher.telemetry.reports import NodeReport, WorkerReport
from launcher.telemetry.stragglers import Flagged, Judge, running_rates


class DictStore:
    """The store operations the board uses, over a dict, counting reads and writes per key kind
    (the key's last part, digits dropped)."""

    capabilities = frozenset({Capability.DELETE})

    def __init__(self):
        self.data: dict[str, bytes] = {}
        self.ops: dict[tuple[str, str], int] = {}
        self.clones = 0

    def _count(self, op: str, key: str) -> None:
        kind = key.rsplit("/", 1)[-1].rstrip("0123456789")
        self.ops[op, kind] = self.ops.get((op, kind), 0) + 1

    def get(self, key: str) -> bytes | None:
        self._count("get", key)
        return self.data.get(key)

    def set(self, key: str, value: bytes) -> None:
        self._count("set", key)
        self.data[key] = value

    def multi_get(self, keys) -> list[bytes | None]:
        for key in keys:
            self._count("multi_get", key)
        return [self.data.get(k) for k in keys]

    def delete(self, keys) -> None:
        for key in keys:
            self.data.pop(key, None)

    def clone(self) -> DictStore:
        self.clones += 1
        return self

    def close(self) -> None:
        pass


def round_of(g: int, n: int, r: int = 0) -> Round:
    return Round(
        run_id="job",
        round=r,
        restart_count=0,
        group_rank=g,
        group_world_size=n,
        rank_offset=g,
        world_size=n,
        master_addr="h",
        master_port=1,
    )


def report_of(rank: int, rate: float | None = 1.0, state: str = "running") -> NodeReport:
    worker = WorkerReport(rank=rank, local_rank=0, pid=100 + rank, state="running", restarts=0, rate=rate, step=7)
    return NodeReport(host="h", state=state, round=0, restarts=0, max_restarts=3, workers=(worker,))


# ---------------------------------------------------------------------------- reports read back


GOOD = {
    "host": "h",
    "state": "running",
    "round": 0,
    "restarts": 0,
    "max_restarts": 3,
    "time": 1.5,
    "node": "h:1",
    "group_rank": 0,
    "workers": [{"rank": 0, "local_rank": 0, "pid": 9, "state": "running", "restarts": 0, "rate": 2.5, "step": 7}],
}


def test_a_report_reads_back_as_it_was_published():
    report = report_of(3).stamped("h:42", 1, 12.5)
    assert NodeReport.decode(report.encode()) == report
    assert NodeReport.decode(json.dumps(GOOD).encode()).workers[0].rate == 2.5


@pytest.mark.parametrize(
    "change",
    [
        {"host": "evil\x1b[2J"},
        {"round": True},
        {"time": "now"},
        {"workers": "all"},
        {"node": "has space"},
        {"max_restarts": None},
    ],
)
def test_a_hostile_report_is_left_out(change):
    assert NodeReport.decode(json.dumps({**GOOD, **change}).encode()) is None
    assert NodeReport.decode(b"[" * 10 + b"x") is None and NodeReport.decode(b"{}" + b" " * (1 << 17)) is None
    assert NodeReport.decode(None) is None


def test_a_hostile_worker_is_dropped_and_a_bad_rate_is_unknown():
    bad_workers = [
        {"rank": True, "local_rank": 0, "pid": 1, "state": "running", "restarts": 0},
        {"rank": 1, "local_rank": 0, "pid": 1, "state": "running", "restarts": 0, "rate": "fast"},
    ]
    report = NodeReport.decode(json.dumps({**GOOD, "workers": bad_workers}).encode())
    assert [w.rank for w in report.workers] == [1] and report.workers[0].rate is None
    assert running_rates([report]) == {}  # a rate that is not a number never reaches the judge


def test_a_node_of_very_many_workers_is_published_without_them():
    many = tuple(WorkerReport(rank=i, local_rank=i, pid=i + 1, state="running", restarts=0) for i in range(5000))
    raw = NodeReport("h", "running", 0, 0, 3, many, node="h:1").encode()
    assert len(raw) <= MAX_VALUE
    assert NodeReport.decode(raw).workers == ()


# ---------------------------------------------------------------------------- the monitor


def monitors(store: DictStore, n: int, clock: FakeClock, threshold: float = 0.5) -> list[Monitor]:
    out = []
    for g in range(n):
        m = Monitor(
            store, "job", Judge(threshold, 60), node_id=f"h:{g}", clock=clock, wall=lambda: 1.0, background=False
        )
        m.begin(round_of(g, n), lambda g=g: report_of(g, rate=0.1 if g == n - 1 else 1.0), lambda e: None)
        out.append(m)
    return out


def test_reports_and_the_straggler_judge_cost_o_n_store_operations_per_interval():
    n, store, clock = 12, DictStore(), FakeClock()
    nodes = monitors(store, n, clock)
    for _ in range(3):  # three intervals; group rank 0 last, so it judges every node's report
        assert {m.tick() for m in reversed(nodes)} == {REPORT_EVERY}
        clock.now += REPORT_EVERY
    assert store.ops["set", "snap"] == 3 * n  # one write per node per interval
    assert store.ops["multi_get", "snap"] == 3 * n  # group rank 0 alone reads them: N per interval
    assert store.ops["set", "stragglers"] == 3 and store.ops["get", "stragglers"] == 3 * n
    assert store.clones == n  # one connection per agent, made once
    assert Board(store, "job").reports(0, n)[5] == report_of(5).stamped("h:5", 5, 1.0)


def test_the_judge_flags_through_the_board_and_every_node_is_told_once():
    n, store, clock = 4, DictStore(), FakeClock()
    posted: list[list] = [[] for _ in range(n)]
    nodes = monitors(store, n, clock)
    for g, m in enumerate(nodes):
        m.begin(round_of(g, n), m._report, posted[g].append)
    for _ in range(40):  # 80 s at 2 s per interval: the slow rank is below half the median for > 60 s
        for m in nodes:
            m.tick()
        clock.now += REPORT_EVERY
    for events in posted:
        assert events == [Flagged(1.0, {n - 1: 0.1})]
    assert Board(store, "job").flagged(0) == Flagged(1.0, {n - 1: 0.1})


def test_without_a_store_the_node_judges_its_own_ranks():
    clock, posted = FakeClock(), []
    m = Monitor(None, "job", Judge(0.5, 10), clock=clock, background=False)
    workers = tuple(
        WorkerReport(rank=i, local_rank=i, pid=i + 1, state="running", restarts=0, rate=0.1 if i == 2 else 1.0)
        for i in range(4)
    )
    m.begin(round_of(0, 1), lambda: NodeReport("h", "running", 0, 0, 0, workers), posted.append)
    for _ in range(7):
        m.tick()
        clock.now += REPORT_EVERY
    assert posted == [Flagged(1.0, {2: 0.1})]
    assert Monitor(None, "job", Judge(0.0, 10)).idle  # off, and nothing to report to: no thread


def test_nothing_is_published_while_the_workers_start_and_the_last_report_comes_at_the_end():
    store, state = DictStore(), ["starting"]
    m = Monitor(store, "job", Judge(0.0, 60), node_id="h:1", wall=lambda: 1.0, background=False)
    m.begin(round_of(0, 1), lambda: None if state[0] == "starting" else report_of(0, state=state[0]), lambda e: None)
    assert m.tick() == RETRY_EVERY and not store.data  # looked at again soon
    state[0] = "succeeded"
    m.stop()
    (last,) = Board(store, "job").reports(0, 1)
    assert last.state == "succeeded" and last.node == "h:1"


def test_a_node_keeps_its_reports_of_the_last_two_rounds_only():
    store = DictStore()
    m = Monitor(store, "job", Judge(0.0, 60), node_id="h:1", background=False)
    for r in range(4):
        m.begin(round_of(0, 1, r), lambda: report_of(0), lambda e: None)
        m.tick()
    assert sorted(k for k in store.data if "snap" in k) == ["job/r2/snap0", "job/r3/snap0"]


def test_a_store_error_never_reaches_the_job(caplog):
    class Broken(DictStore):
        def set(self, key, value):
            raise ConnectionError("the store went away")

    m = Monitor(Broken(), "job", Judge(0.5, 60), node_id="h:1", background=False)
    m.begin(round_of(0, 1), lambda: report_of(0), lambda e: None)
    with caplog.at_level("DEBUG", logger="launcher.telemetry.board"):
        assert m.tick() == REPORT_EVERY
    assert "the job board failed this interval" in caplog.text
