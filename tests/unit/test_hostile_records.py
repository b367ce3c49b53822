"""Hostile values read back from a store, in process: bounded JSON depth, printable text, counters
that hold no number, seal counts that claim a billion nodes, a full disk under the events file."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import pytest

from launcher.cli.status import read_counter, read_status
from launcher.cli.view import render_status
from launcher.config import StatusConfig
from launcher.errors import ConfigError, RendezvousError
from launcher.rendezvous.records import MAX_DEPTH, decode_descriptor, decode_verdict, load, nesting, printable
from launcher.rendezvous.records import token_check as check_of
from launcher.telemetry.board import REPORT_BATCH, Board
from launcher.telemetry.events import EventsFile

DEEP = b"[" * 30000 + b"]" * 30000


@dataclass
class DictStore:
    """The read side of a Store over a dict; counts its reads (a hostile count must cost few)."""

    data: dict[str, bytes] = field(default_factory=dict)
    reads: int = 0

    def get(self, key: str) -> bytes | None:
        self.reads += 1
        return self.data.get(key)

    def multi_get(self, keys) -> list[bytes | None]:
        self.reads += 1
        return [self.data.get(k) for k in keys]

    def add(self, key: str, amount: int) -> int:  # status must never call it: an ADD on garbage hangs up
        raise AssertionError("status wrote to the store")


def status_of(store: DictStore, token: str | None = None) -> dict:
    return read_status(store, StatusConfig("c10d", "job", None, join_token=token))  # type: ignore[arg-type]


@pytest.mark.parametrize("what", [DEEP, b'{"a":' * 5000 + b"1" + b"}" * 5000])
def test_deeply_nested_json_is_a_clean_error_not_a_recursion(what):
    with pytest.raises(RendezvousError, match="nested too deep"):
        load(what, "verdict")
    with pytest.raises(RendezvousError):
        decode_verdict(what)
    with pytest.raises(RendezvousError):
        decode_descriptor(what)


def test_nesting_ignores_brackets_inside_strings_and_passes_our_records():
    assert nesting(json.dumps({"a": "[[[[[[[[[[[[[[[[[[[[", "b": [[1]]}).encode()) <= MAX_DEPTH
    snapshot = json.dumps({"node": "h:1", "workers": [{"rank": i, "x": [1]} for i in range(1000)]}).encode()
    assert nesting(snapshot) == 4
    assert nesting(DEEP) == 30000


@pytest.mark.parametrize(
    "raw, shown",
    [
        (b"job succeeded\n\x1b[2J", "job succeeded  [2J"),
        ("a\u202eb".encode(), "a b"),  # a bidi override reverses what follows on a terminal
        (b"\xff\xfe", "\ufffd\ufffd"),
        (b"x" * 1000, "x" * 300),
    ],
)
def test_text_from_the_store_is_made_printable_and_cut(raw, shown):
    assert printable(raw) == shown


@pytest.mark.parametrize(
    "raw, value", [(None, 0), (b"7", 7), (b"-3", -3), (b" 12 ", 12), (b"abc", None), (b"9" * 40, None), (b"", None)]
)
def test_a_counter_that_holds_no_number_reads_as_unknown(raw, value):
    assert read_counter(raw) == value


def test_a_seal_count_of_a_billion_costs_one_batch_of_reads():
    store = DictStore({"job/token": b"none", "job/round": b"0", "job/r0/sealed": b"999999999"})
    job = status_of(store)
    assert job["nodes"] == [] and job["state"] == "running"
    assert store.reads < 10


def test_reports_are_read_a_batch_at_a_time_until_a_batch_holds_none():
    board = Board(DictStore(), "job")
    board.store.data = {board.report_key(0, g): b"x" for g in range(REPORT_BATCH + 5)}
    got = board.reports(0, 3 * REPORT_BATCH)
    assert len(got) == 2 * REPORT_BATCH and board.store.reads == 1 + 3  # the job's epoch, then three batches


def test_status_shows_a_garbled_counter_as_unknown_not_an_unreachable_store():
    store = DictStore({"job/token": b"none", "job/round": b"1", "job/restarts": b"lots", "job/r1/joined": b"\x1b[2J"})
    job = status_of(store)
    assert job["restarts"] is None and job["forming"]["joined"] is None
    table = render_status({**job, "max_restarts": 3})
    assert "? of 3" in str(table.title) and "? joined" in str(table.title)


def test_status_prints_a_hostile_closing_text_printable():
    store = DictStore({"job/token": b"none", "job/round": b"0", "job/closed": b"it finished\n\x1b[2Jjob succeeded"})
    assert status_of(store)["closed"] == "it finished  [2Jjob succeeded"


def test_status_without_a_token_says_the_job_needs_one():
    store = DictStore({"job/token": check_of("secret", "job"), "job/round": b"0"})
    with pytest.raises(ConfigError, match="needs a join token"):
        status_of(store)
    with pytest.raises(ConfigError, match="wrong join token"):
        status_of(store, token="other")
    assert status_of(store, token="secret")["state"] == "forming"


def test_a_full_disk_under_the_events_file_is_said_once_and_counted(caplog):
    events = EventsFile("/dev/full")  # every write fails with ENOSPC
    with caplog.at_level(logging.WARNING, logger="launcher.telemetry.events"):
        for i in range(3):
            events("restart", {"round": i})
        events.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "cannot write" in lines[0] and "No space left on device" in lines[0]
    assert "the last 3 event(s) were lost" in lines[1]


def test_the_events_file_writes_whole_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    events = EventsFile(str(path))
    events("start", {"round": 0})
    events("finished", {"state": "succeeded"})
    events.close()
    assert [json.loads(line)["event"] for line in path.read_text().splitlines()] == ["start", "finished"]
