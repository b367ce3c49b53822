"""`launcher status`: the job as it stands, read from its rendezvous store. Read-only: it never joins
and never writes a key (a counter is read with `get` first, so a TCPStore `add(key, 0)` never creates
one). The protocol's keys are named by `rendezvous.keys.Keys`; each running node publishes its
report on the job board (`board.Board`) every `board.REPORT_EVERY` seconds; this reads one key per node.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from ..agent.logs import Console, configure_console
from ..config import StatusConfig
from ..errors import ConfigError, RendezvousConnectionError, RendezvousError
from ..policy.quarantine import QuarantineBook
from ..rendezvous.keys import Keys
from ..rendezvous.records import (
    decode_verdict,
    load,
    parse_count,
    printable,
    read_counter,
    sealed_members,
    token_check,
    token_refusal,
)
from ..rendezvous.rerun import job_keys
from ..rendezvous.spares import read_spares
from ..rendezvous.store import Store
from ..telemetry.board import Board
from ..telemetry.goodput import Breakdown, total
from ..telemetry.reports import NodeReport


def spares_of(store: Store, keys: Keys) -> list[dict]:
    """The job's live spares. Its counter is read with get (a TCPStore keeps its number), or, where the
    store keeps counters as versions (etcd: an empty value), with add(0) once it exists."""
    raw = store.get(keys.spares)
    count = 0 if raw is None else (read_counter(raw) or 0) if raw else store.add(keys.spares, 0)
    now = time.time()
    return [
        {"node": s.node, "host": s.host, "waiting": round(max(0.0, now - s.since), 1)}
        for s in read_spares(store, keys, count)
        if s.alive
    ]


def open_store(config: StatusConfig) -> Store:
    """A plain client of the job's store: no lease, no hosting; short timeouts (a status is interactive)."""
    settings = config.rendezvous
    if config.rdzv_backend == "c10d":
        from ..rendezvous.c10d import TCPStoreAdapter

        return TCPStoreAdapter(settings.host, settings.port, 5.0, connect_timeout=5.0)  # type: ignore[union-attr]
    from ..rendezvous.etcd.store import EtcdStore

    return EtcdStore(settings.cluster, None, retry_for=5.0)  # type: ignore[union-attr]


def read_status(store: Store, config: StatusConfig) -> dict:
    """The job as one dict (the --json output). Raises ConfigError on a wrong or missing token."""
    keys = job_keys(store, config.rdzv_id)  # in the job's current epoch (`rendezvous.rerun`)
    token, started = store.multi_get([keys.token, keys.round])
    job: dict = {"run_id": config.rdzv_id, "read_at": round(time.time(), 3)}
    if not token and not started:
        return {**job, "state": "absent", "nodes": []}
    if token not in (None, b"", b"none") and token != token_check(config.join_token, config.rdzv_id):
        raise ConfigError(token_refusal(token, config.join_token, config.rdzv_id))  # a job without one: anyone
    board = Board(store, config.rdzv_id, keys)

    def count(key: str) -> int | None:
        """A counter as the store holds it; None when it holds no number (a hostile value: an ADD on
        it would make the store hang up, which would read as an unreachable store)."""
        return read_counter(store.get(key))

    r = parse_count(started or b"0", "round number")
    closed = store.get(keys.closed)
    job.update(round=r, restarts=count(keys.restarts))
    members, shown = sealed_members(store.get(keys.sealed(r))), r
    if members is None:
        job["forming"] = {"round": r, "joined": count(keys.joined(r))}
        shown = r - 1
        members = sealed_members(store.get(keys.sealed(shown))) if r > 0 else None
    reports = [(g, report) for g, report in enumerate(board.reports(shown, members or 0)) if report is not None]
    job["nodes"] = [_node(g, report) for g, report in reports]
    job["max_restarts"] = max((report.max_restarts for _, report in reports), default=None)
    # The counter charges each failure, the one that spent the budget included (it closed the job, no
    # restart followed): the restarts done are what the agents' verdict line says, never over the budget.
    job["failures"] = job["restarts"]
    if job["restarts"] is not None and job["max_restarts"] is not None:
        job["restarts"] = min(job["restarts"], job["max_restarts"])
    job["stragglers"] = [w.rank for _, report in reports for w in report.workers if w.straggler]
    job["goodput"] = job_goodput(store, keys, shown, [report for _, report in reports])
    book = QuarantineBook(store, keys.quarantined, keys.quarantine)  # reads only: get and multi_get
    job["quarantined"] = [asdict(q) for q in book.all() if q.active(time.time())]
    job["spares"] = spares_of(store, keys)
    if closed:
        job["state"] = "closed"
        job["closed"] = printable(closed)
        raw = store.get(keys.verdict)
        try:
            job["verdict"] = asdict(decode_verdict(raw)) if raw else None
        except RendezvousError:
            job["verdict"] = None
    elif "forming" in job:
        job["state"] = "forming"
    elif reports and all(report.state == "succeeded" for _, report in reports) and len(reports) == members:
        job["state"] = "succeeded"
    else:
        job["state"] = "running"
    return job


def job_goodput(store: Store, keys: Keys, r: int, reports: list[NodeReport]) -> dict | None:
    """The job's goodput: the figure the nodes agreed at the end (`accounting.job_breakdown`), or
    while it runs the total of the nodes' latest reports."""
    final = Breakdown.from_dict(_json(store.get(f"{keys.of_round(r)}goodput")))
    if final is not None:
        return {**final.to_dict(), "final": True}
    parts = [report.goodput for report in reports if report.goodput is not None]
    parts = [b for b in parts if b.wall > 0 or not b.standby]  # a spare standing by: not in the job's figure
    return {**total(parts).to_dict(), "final": False} if parts else None


def _json(raw: bytes | None) -> object:
    try:
        return load(raw, "goodput") if raw else None
    except RendezvousError:
        return None


def _node(g: int, report: NodeReport) -> dict:
    """One node of the --json output: its report, the age of it (clocks may differ by host), no timestamp."""
    node = asdict(report)
    node.update(group_rank=g, heartbeat_age=round(max(0.0, time.time() - node.pop("time")), 1))
    return node


def status_main(config: StatusConfig, show) -> int:
    """Read (and with --watch, re-read) the job; `show(job)` prints it. Exit 0, 1 (store unreachable), 2 (refused)."""
    # The store clients' notes on stderr: a store that does not answer yet is retried for 5 s, said
    # after a moment (`launcher: cannot reach the store ... yet`), never waited on silently.
    configure_console(Console(), "info")
    try:
        store = open_store(config)
    except RendezvousConnectionError as e:
        raise StatusUnreachable(str(e)) from None
    try:
        while True:
            try:
                show(read_status(store, config))
            except ConfigError:
                raise
            except RendezvousConnectionError as e:
                raise StatusUnreachable(str(e)) from None
            except RendezvousError as e:  # etcd refused the credentials or the certificate: bad input
                raise ConfigError(str(e)) from None
            if config.watch is None:
                return 0
            time.sleep(config.watch)
    finally:
        store.close()


class StatusUnreachable(Exception):
    """The store could not be read: one line, exit 1."""
