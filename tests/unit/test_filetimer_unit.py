"""The file-timer watchdog's pipe and timers, in-process with an injected clock (torch's FileTimerClient
wire format: one JSON line per request, a negative expiration releasing the scope)."""

from __future__ import annotations

import json
import os
import signal
import stat

import pytest

from launcher.agent.filetimer import Expired, FileTimer, from_environ


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def send(path: str, pid: int, scope: str, at: float, sig: int = signal.SIGKILL) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # as FileTimerClient opens it
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"version": 1, "pid": pid, "scope_id": scope, "expiration_time": at, "signal": sig}) + "\n")


@pytest.fixture
def timer(tmp_path):
    clock = Clock()
    t = FileTimer(str(tmp_path / "pipe"), clock)
    yield t, clock
    t.close()


def test_a_timer_expires_at_its_time_and_once(timer):
    t, clock = timer
    send(t.path, 11, "step", clock.now + 5)
    assert t.poll() == []
    clock.now += 5
    assert t.poll() == [Expired(11, "step", int(signal.SIGKILL))]
    assert t.poll() == []


def test_release_and_rearm(timer):
    t, clock = timer
    send(t.path, 11, "step", clock.now + 1)
    send(t.path, 11, "step", -1)  # released
    send(t.path, 12, "load", clock.now + 1)
    send(t.path, 12, "load", clock.now + 60)  # re-armed later
    clock.now += 2
    assert t.poll() == []


def test_no_signal_expires_quietly_and_ended_workers_are_forgotten(timer):
    t, clock = timer
    send(t.path, 11, "quiet", clock.now, sig=0)
    send(t.path, 12, "old round", clock.now + 1)
    t.poll()
    t.forget([12])
    clock.now += 10
    assert t.poll() == []


def test_a_stray_line_is_one_warning(timer, caplog):
    t, clock = timer
    fd = os.open(t.path, os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, b"not json\n")
    os.close(fd)
    send(t.path, 11, "step", clock.now)
    assert t.poll() == [Expired(11, "step", int(signal.SIGKILL))]
    assert any("not a timer request" in r.getMessage() for r in caplog.records)


def test_enabled_only_by_1_and_the_pipe_is_removed(tmp_path):
    assert from_environ({"TORCHELASTIC_TIMER_FILE": str(tmp_path / "p")}) is None
    assert from_environ({"TORCHELASTIC_ENABLE_FILE_TIMER": "0"}) is None
    t = from_environ({"TORCHELASTIC_ENABLE_FILE_TIMER": "1", "TORCHELASTIC_TIMER_FILE": str(tmp_path / "p")})
    assert t is not None and stat.S_ISFIFO(os.stat(t.path).st_mode)
    t.close()
    assert not os.path.exists(tmp_path / "p")


def test_a_path_that_is_not_a_pipe_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match="not a named pipe"):
        FileTimer(str(tmp_path / "file"))
