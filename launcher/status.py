"""`launcher status`: the job as it stands, read from its rendezvous store. Read-only: it never joins
and never writes a key (a counter is read with `get` first, so a TCPStore `add(key, 0)` never creates
one). Each running node publishes its snapshot under `r<round>/snap<group rank>` every
`board.SNAPSHOT_EVERY` seconds; this reads one key per node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

from .config import StatusConfig
from .errors import ConfigError, RendezvousConnectionError, RendezvousError
from .rendezvous.records import (
    decode_verdict,
    parse_count,
    printable,
    read_snapshot,
    sealed_members,
    token_check,
    token_refusal,
)
from .rendezvous.store import Store


def open_store(config: StatusConfig) -> Store:
    """A plain client of the job's store: no lease, no hosting; short timeouts (a status is interactive)."""
    settings = config.rendezvous
    if config.rdzv_backend == "c10d":
        from .rendezvous.c10d import TCPStoreAdapter

        return TCPStoreAdapter(settings.host, settings.port, 5.0, connect_timeout=5.0)  # type: ignore[union-attr]
    from .rendezvous.etcd.store import EtcdStore

    return EtcdStore(settings.cluster, None, retry_for=5.0)  # type: ignore[union-attr]


def read_status(store: Store, config: StatusConfig) -> dict:
    """The job as one dict (the --json output). Raises ConfigError on a wrong or missing token."""
    k = lambda key: f"{config.rdzv_id}/{key}"  # noqa: E731
    token = store.get(k("token"))
    job: dict = {"run_id": config.rdzv_id, "read_at": round(time.time(), 3)}
    if token is None:
        return {**job, "state": "absent", "nodes": []}
    if token != token_check(config.join_token, config.rdzv_id):
        raise ConfigError(token_refusal(token, config.join_token, config.rdzv_id))

    def count(key: str) -> int | None:
        """A counter as the store holds it; None when it holds no number (a hostile value: an ADD on
        it would make the store hang up, which would read as an unreachable store)."""
        return read_counter(store.get(k(key)))

    r = parse_count(store.get(k("round")) or b"0", "round number")
    closed = store.get(k("closed"))
    job.update(round=r, restarts=count("restarts"))
    members, shown = sealed_members(store.get(k(f"r{r}/sealed"))), r
    if members is None:
        job["forming"] = {"round": r, "joined": count(f"r{r}/joined")}
        shown = r - 1
        members = sealed_members(store.get(k(f"r{shown}/sealed"))) if r > 0 else None
    nodes = []
    for g, raw in enumerate(read_snapshots(store, lambda g: k(f"r{shown}/snap{g}"), members or 0)):
        snap = read_snapshot(raw)
        if snap is not None:
            age = round(max(0.0, time.time() - snap.pop("time")), 1)  # of its last snapshot: clocks may differ by host
            nodes.append({**snap, "group_rank": g, "heartbeat_age": age})
    job["nodes"] = nodes
    job["max_restarts"] = max((n["max_restarts"] for n in nodes), default=None)
    job["stragglers"] = [w["rank"] for n in nodes for w in n["workers"] if w.get("straggler")]
    if closed:
        job["state"] = "closed"
        job["closed"] = printable(closed)
        raw = store.get(k("verdict"))
        try:
            job["verdict"] = asdict(decode_verdict(raw)) if raw else None
        except RendezvousError:
            job["verdict"] = None
    elif "forming" in job:
        job["state"] = "forming"
    elif nodes and all(n["state"] == "succeeded" for n in nodes) and len(nodes) == members:
        job["state"] = "succeeded"
    else:
        job["state"] = "running"
    return job


SNAPSHOT_BATCH = 1024  # snapshots read per MULTI_GET


def read_snapshots(store: Store, key_of: Callable[[int], str], count: int) -> list[bytes | None]:
    """The snapshots of group ranks 0..count-1, a batch at a time; a batch with none ends the read,
    so a hostile seal count (999999999) costs one batch, not a billion reads (group ranks are
    dense: a real round's snapshots are all there, or all but a few just formed)."""
    out: list[bytes | None] = []
    for start in range(0, count, SNAPSHOT_BATCH):
        keys = [key_of(g) for g in range(start, min(count, start + SNAPSHOT_BATCH))]
        batch = [raw or None for raw in store.multi_get(keys)]
        if not any(batch):
            break
        out.extend(batch)
    return out


def read_counter(raw: bytes | None) -> int | None:
    """A counter written by ADD (a decimal, maybe signed); 0 when absent; None when it is no number."""
    if raw is None:
        return 0
    text = raw.strip()
    return int(text) if text.lstrip(b"+-").isdigit() and len(text) <= 20 else None


def status_main(config: StatusConfig, show) -> int:
    """Read (and with --watch, re-read) the job; `show(job)` prints it. Exit 0, 1 (store unreachable), 2 (refused)."""
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
