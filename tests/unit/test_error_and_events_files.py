"""The files a run leaves: torch's error-file JSON written by `launcher.record` and read back for
the summary, and the JSON-lines events file (one object per line; a failing disk never stops the job)."""

from __future__ import annotations

import json

import pytest

from launcher.telemetry.events import EventsFile
from launcher.telemetry.summary import read_error_file
from launcher.worker.errorfile import record, write_error_file


def test_record_writes_the_exception_where_torch_expects_it_and_reraises(tmp_path, monkeypatch):
    path = tmp_path / "deep" / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @record
    def main():
        raise ValueError("bad learning rate -1")

    with pytest.raises(ValueError):
        main()
    message, stack = read_error_file(str(path))
    assert message == "ValueError: bad learning rate -1"
    assert "raise ValueError" in stack and "Traceback" in stack
    assert json.loads(path.read_text())["message"]["extraInfo"]["timestamp"].isdigit()


def test_without_a_path_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    write_error_file(RuntimeError("x"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "content, expect",
    [
        (None, ("", "")),
        ('{"message": "plain text"}', ("plain text", "")),
        ('{"message": {"message": "E: m", "extraInfo": {"py_callstack": "tb"}}}', ("E: m", "tb")),
        ("{not json", ("", "")),
        ('{"other": 1}', ("", "")),
        ('["a list"]', ("", "")),
    ],
)
def test_an_error_file_of_any_shape_reads_as_message_and_stack_or_nothing(tmp_path, content, expect):
    path = tmp_path / "e.json"
    if content is not None:
        path.write_text(content)
    assert read_error_file(str(path)) == expect
    assert read_error_file(None) == ("", "")


def test_events_are_json_lines_with_time_and_kind(tmp_path):
    path = tmp_path / "sub" / "events.jsonl"
    events = EventsFile(str(path))
    events("started", {"round": 0, "path": tmp_path})  # what JSON cannot take is written as text
    events("stopping", {"signal": "SIGTERM"})
    events.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["event"], e.get("round"), e.get("signal")) for e in lines] == [
        ("started", 0, None),
        ("stopping", None, "SIGTERM"),
    ]
    assert lines[0]["path"] == str(tmp_path) and all(isinstance(e["time"], float) for e in lines)


def test_an_events_file_that_cannot_be_written_never_raises(tmp_path):
    events = EventsFile(str(tmp_path / "events.jsonl"))
    events.close()
    events("late", {})  # written after close: dropped, as a full disk's would be
    events.close()
