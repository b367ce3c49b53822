"""`--metrics_port`: this agent's Prometheus endpoint (prometheus_client, imported only here, and
this module only when the flag is given).

Every scrape reads the agent as it stands (a custom collector, no metric objects kept up to date
from the loop): the supervisor's snapshot and failures, the last report the job board published
(steps, step rates, stragglers), and the goodput accountant's breakdown.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from ..spec import Failure, GroupState, WorkerState
from .accounting import Accountant
from .goodput import Component
from .reports import NodeReport

log = logging.getLogger(__name__)


def cause_of(f: Failure) -> str:
    """A failure's cause as a label of few values: hang, oom, signal or exit."""
    if f.reason.startswith("hung"):
        return "hang"
    if f.reason:
        return "oom"
    return "signal" if f.exit.signal else "exit"


class AgentCollector:
    """The metrics of one agent, read at each scrape. `supervisor` is read only (from the HTTP thread)."""

    def __init__(self, supervisor, accountant: Accountant, report: Callable[[], NodeReport | None], info: dict):
        self.supervisor, self.accountant, self.report, self.info = supervisor, accountant, report, info

    def describe(self) -> list[Metric]:
        return []  # nothing to check at registration: every family comes from collect()

    def collect(self) -> Iterator[Metric]:
        sup = self.supervisor
        snap = sup.snapshot()
        rnd = sup.round
        info = InfoMetricFamily("launcher", "The job and this agent.")
        info.add_metric([], self.info)
        yield info
        yield _gauge("launcher_round", "The rendezvous round this node runs (or last ran).", snap.round)
        yield _gauge("launcher_restarts", "Restarts of the job used.", snap.restarts)
        yield _gauge("launcher_restarts_budget", "Restarts allowed (--max_restarts).", sup.config.max_restarts)
        state = GaugeMetricFamily(
            "launcher_group_state", "This node's worker group state (1: current).", labels=["state"]
        )
        for s in GroupState:
            state.add_metric([s.value], 1.0 if snap.state is s else 0.0)
        yield state
        nodes = GaugeMetricFamily(
            "launcher_nodes", "Nodes of the job by state, as this node's round has them.", labels=["state"]
        )
        nodes.add_metric(["member"], rnd.group_world_size if rnd else 0)
        yield nodes
        yield _gauge(
            "launcher_group_rank", "This node's group rank (-1: in no round yet).", rnd.group_rank if rnd else -1
        )
        yield _gauge("launcher_world_size", "Workers in the job.", rnd.world_size if rnd else 0)
        by_state = Counter(w.state for w in snap.workers)
        workers = GaugeMetricFamily("launcher_workers", "This node's workers by state.", labels=["state"])
        for s in WorkerState:
            workers.add_metric([s.value], by_state.get(s.value, 0))
        yield workers
        yield from self._ranks()
        failures = CounterMetricFamily(
            "launcher_failures", "This node's worker failures by cause (collateral stops left out).", labels=["cause"]
        )
        counts = Counter(cause_of(f) for f in list(sup.failures) if not f.collateral)
        for cause in ("exit", "signal", "oom", "hang"):
            failures.add_metric([cause], counts.get(cause, 0))
        yield failures
        yield from self._goodput()

    def _ranks(self) -> Iterator[Metric]:
        report = self.report()
        step = GaugeMetricFamily("launcher_worker_step", "A rank's last launcher.progress(step=).", labels=["rank"])
        rate = GaugeMetricFamily("launcher_worker_step_rate", "A rank's steps per second.", labels=["rank"])
        slow = GaugeMetricFamily("launcher_worker_straggler", "1: flagged by --straggler_threshold.", labels=["rank"])
        flagged = 0
        for w in report.workers if report else ():
            if w.step is not None:
                step.add_metric([str(w.rank)], w.step)
            if w.rate is not None:
                rate.add_metric([str(w.rank)], w.rate)
            slow.add_metric([str(w.rank)], 1.0 if w.straggler else 0.0)
            flagged += bool(w.straggler)
        yield from (step, rate, slow)
        yield _gauge("launcher_stragglers", "This node's ranks flagged as stragglers.", flagged)

    def _goodput(self) -> Iterator[Metric]:
        b = self.accountant.breakdown()
        seconds = GaugeMetricFamily(  # a gauge: a hang moves seconds already counted as training to stalls
            "launcher_goodput_seconds", "This node's wall time by goodput component.", labels=["component"]
        )
        for c in Component:
            seconds.add_metric([c.value], b.seconds(c))
        yield seconds
        yield _gauge("launcher_goodput_wall_seconds", "This node's wall time so far.", b.wall)
        yield _gauge("launcher_goodput_ratio", "Training time / wall time on this node.", b.goodput)
        yield _gauge(
            "launcher_goodput_provisional",
            "1 while the figures may still move: the time since the workers started counts as training until"
            " their first step (or their process group forming) says how much of it was start-up or restart.",
            float(b.provisional),
        )
        yield _gauge("launcher_goodput_standby_seconds", "Seconds stood by as a spare (apart from wall).", b.standby)
        yield CounterMetricFamily("launcher_redone_steps", "Steps repeated after restarts.", value=b.redone_steps)
        yield _gauge("launcher_straggler_steps", "Steps flagged ranks fell behind the median.", b.straggler_steps)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class MetricsServer:
    """The HTTP endpoint; `close()` stops it."""

    def __init__(self, host: str, port: int, collector: AgentCollector):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)  # type: ignore[arg-type]
        self.httpd, self.thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self.httpd.server_address[1]

    def close(self) -> None:
        """Stop serving without waiting: `shutdown()` blocks until serve_forever's next poll (0.5 s),
        which every job's exit would pay; the thread is a daemon, so the process may end first."""
        threading.Thread(target=self.httpd.shutdown, name="launcher-metrics-stop", daemon=True).start()


def serve(host: str, port: int, collector: AgentCollector) -> MetricsServer | None:
    """Start the endpoint; a port that cannot be bound never stops the job (it is said)."""
    try:
        server = MetricsServer(host, port, collector)
    except OSError as e:
        log.warning(f"cannot serve metrics on {host}:{port}: {e.strerror or e}; the job goes on without them")
        return None
    shown = f"[{host}]" if ":" in host else host
    log.info(f"metrics on http://{shown}:{server.port}/metrics")
    return server
