"""metrics.AgentCollector in-process: the families a scrape gets from a supervisor's state."""

from types import SimpleNamespace

import prometheus_client  # a plain dependency (setup.cfg): never skipped

from launcher.spec import Exit, Failure, GroupState, Snapshot, Worker, WorkerRow
from launcher.telemetry.accounting import Accountant
from launcher.telemetry.metrics import AgentCollector, cause_of
from launcher.telemetry.reports import NodeReport, WorkerReport


def failure(returncode: int, reason: str = "", collateral: bool = False) -> Failure:
    return Failure(Worker(0, 1, 2, 4), 10, Exit(returncode), 0.0, "h", 1, collateral, reason)


def test_a_scrape_has_the_round_the_workers_the_steps_the_failures_and_the_goodput():
    rows = [WorkerRow(1, 0, 10, "running", 0.0), WorkerRow(2, 1, 11, "running", 0.0, straggler=True)]
    sup = SimpleNamespace(
        snapshot=lambda: Snapshot(GroupState.RUNNING, 2, 1, rows),
        round=SimpleNamespace(group_world_size=3, group_rank=1, world_size=6),
        config=SimpleNamespace(max_restarts=4),
        failures=[failure(5), failure(-9, reason="killed by the kernel's OOM killer"), failure(-15, collateral=True)],
    )
    report = NodeReport("h", "running", 2, 1, 4, (WorkerReport(1, 0, 10, "running", 1, step=41, rate=2.5),))
    now = [50.0]
    acc = Accountant(lambda: [], clock=lambda: now[0])
    now[0] = 60.0
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(sup, acc, lambda: report, {"run_id": "j", "host": "h", "backend": "c10d"}))
    text = prometheus_client.generate_latest(registry).decode()
    for line in (
        'launcher_info{backend="c10d",host="h",run_id="j"} 1.0',
        "launcher_round 2.0",
        "launcher_restarts 1.0",
        "launcher_restarts_budget 4.0",
        'launcher_group_state{state="running"} 1.0',
        'launcher_nodes{state="member"} 3.0',
        'launcher_workers{state="running"} 2.0',
        'launcher_worker_step{rank="1"} 41.0',
        'launcher_worker_step_rate{rank="1"} 2.5',
        'launcher_failures_total{cause="exit"} 1.0',
        'launcher_failures_total{cause="oom"} 1.0',
        'launcher_failures_total{cause="signal"} 0.0',
        'launcher_goodput_seconds{component="rendezvous"} 10.0',
        "launcher_goodput_wall_seconds 10.0",
        "launcher_goodput_standby_seconds 0.0",
    ):
        assert line in text, line
    acc("waiting", {"what": "spare"})  # a spare stands by: apart from the wall time
    now[0] = 70.0
    text = prometheus_client.generate_latest(registry).decode()
    assert "launcher_goodput_standby_seconds 20.0" in text and "launcher_goodput_wall_seconds 0.0" in text, text


def test_causes():
    assert [cause_of(f) for f in (failure(1), failure(-9), failure(-6, reason="hung: no progress"))] == [
        "exit",
        "signal",
        "hang",
    ]


def test_a_figure_a_first_step_will_reclassify_is_published_as_provisional():
    # it read 0.99 during start-up and 0.42 three seconds later, once the first step moved the time
    sup = SimpleNamespace(
        snapshot=lambda: Snapshot(GroupState.RUNNING, 0, 0, []),
        round=SimpleNamespace(group_world_size=1, group_rank=0, world_size=2),
        config=SimpleNamespace(max_restarts=0),
        failures=[],
    )
    now = [0.0]
    acc = Accountant(lambda: [], clock=lambda: now[0])
    acc("starting", {})
    acc("spawn", {"rank": 0})
    acc("running", {"round": 0, "group_rank": 0, "group_world_size": 1, "restarts": 0})
    now[0] = 3.0
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(sup, acc, lambda: None, {"run_id": "j", "host": "h", "backend": "c10d"}))
    text = prometheus_client.generate_latest(registry).decode()
    assert "launcher_goodput_provisional 1.0" in text, text
    assert acc.breakdown().provisional and not acc.finish().provisional  # a final figure never is
