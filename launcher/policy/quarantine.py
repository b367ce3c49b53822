"""Quarantined hosts: the small records a job keeps in its store, so every node, `launcher status`
and a node started again on the same host see them.

A node is quarantined when its health check fails or its workers failed in k of its last rounds
(`policy.History`). It writes one record (host, why, until when) and leaves the job with exit code
69; a node that starts on that host before `until` reads the record and refuses to join, with the
same code. Records are appended (a counter and one key each: no read-modify-write), bounded in
size, checked when read back.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

TYPE_CHECKING = False  # not typing's: typing's import costs a launch's start ~4 ms
if TYPE_CHECKING:
    from typing import Protocol
else:
    Protocol = object  # the type checker's; at run time a plain base

log = logging.getLogger(__name__)
MAX_RECORD = 1024  # bytes: a host name, a one-line reason and two times
MAX_RECORDS = 256  # read back at most this many (a job quarantining more has other problems)
BATCH = 16  # records read per request
WHY_LIMIT = 300


@dataclass(frozen=True)
class Quarantine:
    """One host kept out of the job until `until` (epoch seconds), and why."""

    host: str
    why: str
    at: float
    until: float
    node: str = ""  # the agent that wrote it

    def active(self, now: float) -> bool:
        return self.at <= now < self.until

    def left(self, now: float) -> str:
        """What is left of its cooldown, and why: the line a node refused on this host says."""
        return f"{max(0, round(self.until - now))} s of its cooldown left, for: {self.why}"


class Records(Protocol):
    """What the book needs of a store (every rendezvous store offers it)."""

    def add(self, key: str, amount: int) -> int: ...
    def set(self, key: str, value: bytes) -> None: ...
    def get(self, key: str) -> bytes | None: ...
    def multi_get(self, keys: Sequence[str]) -> list[bytes | None]: ...


class QuarantineBook:
    """The job's quarantine records in its store; `count_key` and `record_key(i)` name the keys."""

    def __init__(self, store: Records, count_key: str, record_key: Callable[[int], str]):
        self.store = store
        self.count_key = count_key
        self.record_key = record_key

    def add(self, record: Quarantine) -> None:
        i = self.store.add(self.count_key, 1)
        self.store.set(self.record_key(i), encode(record))

    def all(self) -> list[Quarantine]:
        """Every record, read BATCH keys at a time until a batch holds none. Reads only (`launcher
        status` writes nothing, and a counter's value is not its count on every store)."""
        records: list[Quarantine] = []
        for first in range(1, MAX_RECORDS + 1, BATCH):
            values = self.store.multi_get([self.record_key(i) for i in range(first, first + BATCH)])
            records += [r for r in (decode(v) for v in values if v) if r is not None]
            if not any(values):
                break
        return records


def note_host(path: str, name: str) -> None:
    """Append `name` as one line to `path` ($LAUNCHER_QUARANTINE_FILE: the Slurm scripts exclude what it lists)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{name}\n".encode())  # one small write: lines from several nodes never interleave
        finally:
            os.close(fd)
    except OSError as e:  # the exit code still says it
        log.warning(f"cannot note the quarantine in LAUNCHER_QUARANTINE_FILE={path}: {e.strerror or e}")


def make_record(host: str, why: str, cooldown: float, node: str = "", now: float | None = None) -> Quarantine:
    now = time.time() if now is None else now
    return Quarantine(host=host, why=_line(why), at=now, until=now + cooldown, node=node)


def encode(record: Quarantine) -> bytes:
    return json.dumps(asdict(record)).encode()[:MAX_RECORD]


def decode(raw: bytes) -> Quarantine | None:
    """A record read back, checked field by field; None (logged) for anything else."""
    try:
        if len(raw) > MAX_RECORD:
            raise ValueError("oversized")
        value = json.loads(raw)
        record = Quarantine(
            host=str(value["host"]),
            why=_line(str(value["why"])),
            at=float(value["at"]),
            until=float(value["until"]),
            node=str(value.get("node", "")),
        )
    except (ValueError, KeyError, TypeError) as e:
        log.warning(f"the job's store holds a malformed quarantine record ({e}); ignoring it")
        return None
    return record


def _line(text: str) -> str:
    first = (text.splitlines() or [""])[0]
    return "".join(c if c.isprintable() else "?" for c in first)[:WHY_LIMIT]
