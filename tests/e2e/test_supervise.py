"""Supervision with real processes: exit codes, the failure summary, stopping and killing, orphans,
signals, restarts that re-initialise a gloo group, error files and log routing."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from support.launcher_runs import all_have, marks
from support.paths import worker
from support.processes import procs_with_token, wait_for, wait_gone

# ---------------------------------------------------------------------------- helpers


def signal_workers(launch, mark_dir: Path, *flags: str, **env: str):
    """The launcher with 2 signals.py workers (noting what they see in `mark_dir`), once both are ready."""
    p = launch.start("--nproc_per_node", "2", *flags, worker("signals.py"), env={"MARK_DIR": str(mark_dir), **env})
    wait_for(all_have(mark_dir, "ready"), what="workers ready", proc=p)
    return p


def only_run_dir(parent: Path, pattern: str) -> Path:
    dirs = sorted(parent.glob(pattern))
    assert len(dirs) == 1, dirs
    return dirs[0]


NOTE = re.compile(r"^(?:\S+ )?launcher: ")  # the launcher's own lines, timestamped off a terminal


def worker_lines(text: str) -> list[str]:
    """Console lines that came from workers."""
    return [l for l in text.splitlines() if not NOTE.match(l)]


def launcher_lines(text: str) -> list[str]:
    """The launcher's own lines, without their "[timestamp ]launcher: " lead."""
    return [NOTE.sub("", l) for l in text.splitlines() if NOTE.match(l)]


# ---------------------------------------------------------------------------- exit codes and the summary


def test_worker_exit_code_becomes_launcher_exit_code(launch):
    r = launch.run("--nproc_per_node", "3", worker("exit_code.py"), env={"FAIL_RANK": "1", "CODE": "3"}, timeout=60)
    assert r.returncode == 3, r.stderr
    root = [l for l in r.stderr.splitlines() if "root cause:" in l]
    assert len(root) == 1, r.stderr
    assert "rank 1 (local rank 1)" in root[0] and "exited with code 3" in root[0], root[0]
    assert "job failed (exit code 3) after 0 restart(s)" in r.stderr
    stopped = [l for l in r.stderr.splitlines() if "stopped by the launcher:" in l]
    assert len(stopped) == 1, r.stderr
    assert "rank 0 (pid" in stopped[0] and "rank 2 (pid" in stopped[0] and "rank 1 " not in stopped[0]
    assert "also failed" not in r.stderr
    assert wait_gone(launch.token) == []


def test_worker_killed_by_sigkill(launch):
    r = launch.run("--nproc_per_node", "2", worker("kill_self.py"), timeout=60)
    assert r.returncode == 1, r.stderr
    root = next(l for l in r.stderr.splitlines() if "root cause:" in l)
    assert "rank 0" in root and "killed by SIGKILL" in root and "out of memory" not in root, (
        root
    )  # only the OOM killer is OOM
    assert "stopped by the launcher: rank 1" in r.stderr


def test_worker_ignoring_sigterm_is_killed_after_the_grace(launch, tmp_path):
    ev = tmp_path / "events.jsonl"
    r = launch.run(
        "--nproc_per_node",
        "2",
        "--shutdown_timeout",
        "1",
        "--events_file",
        str(ev),
        worker("ignore_sigterm.py"),
        env={"MARK_DIR": str(tmp_path)},
        timeout=60,
    )
    assert r.returncode == 1, r.stderr
    assert (tmp_path / "1.ready").exists()
    assert "root cause: rank 0" in r.stderr and "exited with code 1" in r.stderr
    assert "stopped by the launcher: rank 1" in r.stderr
    # The grace was honoured, then SIGKILL ended it (the worker ignores SIGTERM forever): timed from the
    # stop to rank 1's exit on the events file, so a loaded start-up (the zygote imports torch) is not in it.
    events = [json.loads(line) for line in ev.read_text().splitlines()]
    stop = next(e["time"] for e in events if e["event"] == "stopping")
    gone = next(e["time"] for e in events if e["event"] == "exit" and e["rank"] == 1)
    assert 1.0 <= gone - stop < 10.0, gone - stop
    assert wait_gone(launch.token) == []


# ---------------------------------------------------------------------------- no orphans


@pytest.mark.parametrize("code", [0, 1], ids=["success", "failure"])
def test_grandchild_in_its_own_session_does_not_survive(launch, tmp_path, code):
    r = launch.run(
        "--nproc_per_node",
        "2",
        worker("fork_grandchild.py"),
        env={"MARK_DIR": str(tmp_path), "CODE": str(code)},
        timeout=30,
    )
    assert r.returncode == code, r.stderr
    pids = [int((tmp_path / f"{rank}.pid").read_text()) for rank in (0, 1)]
    assert len(set(pids)) == 2
    assert wait_gone(launch.token, timeout=2.0) == []


def test_agent_sigkill_leaves_no_worker_or_grandchild(launch, tmp_path):
    p = launch.start(
        "--nproc_per_node", "2", worker("fork_grandchild.py"), env={"MARK_DIR": str(tmp_path), "STAY": "60"}
    )
    wait_for(lambda: all((tmp_path / f"{r}.pid").exists() for r in (0, 1)), what="the grandchildren", proc=p)
    grandchildren = [int((tmp_path / f"{r}.pid").read_text()) for r in (0, 1)]
    alive = set(procs_with_token(launch.token))
    assert set(grandchildren) <= alive and len(alive) >= 6  # launcher, guard, 2 workers, 2 grandchildren
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    assert wait_gone(launch.token, timeout=1.0) == []


# ---------------------------------------------------------------------------- signals to the launcher


def test_sigterm_is_forwarded_then_exit_143(launch, tmp_path):
    p = signal_workers(launch, tmp_path)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 143, err
    for rank in (0, 1):
        assert marks(tmp_path, rank) == ["ready", "SIGTERM", "exit"], marks(
            tmp_path, rank
        )  # saw SIGTERM, left on its own
    assert "got SIGTERM" in err
    assert wait_gone(launch.token) == []


def test_second_sigint_kills_at_once(launch, tmp_path):
    events = tmp_path / "events.jsonl"
    p = signal_workers(
        launch, tmp_path, "--shutdown_timeout", "60", "--events_file", str(events), IGNORE="SIGINT,SIGTERM"
    )
    p.send_signal(signal.SIGINT)
    first = time.monotonic()
    wait_for(all_have(tmp_path, "SIGINT"), what="workers to get the first SIGINT", proc=p)
    stopping = {"event": "stopping", "reason": "signal", "signal": "SIGINT", "grace": 60.0}
    wait_for(
        lambda: any(stopping.items() <= json.loads(l).items() for l in events.read_text().splitlines()),
        what="the graceful stop to begin",
        proc=p,
    )
    assert p.poll() is None  # the graceful stop waits out its 60 s: the workers ignore SIGINT
    time.sleep(max(0.0, 0.6 - (time.monotonic() - first)))  # past the 0.5 s window that folds a repeat into one
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert time.monotonic() - t0 < 5.0
    assert p.returncode == 130, err
    assert "second SIGINT" in err
    for rank in (0, 1):
        assert "exit" not in marks(tmp_path, rank)  # killed, not left on their own
    assert wait_gone(launch.token) == []


def test_sigterm_twice_is_tolerated(launch, tmp_path):
    p = signal_workers(launch, tmp_path, "--shutdown_timeout", "20", EXIT_DELAY="0.6")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    wait_for(all_have(tmp_path, "SIGTERM"), what="workers to get SIGTERM", proc=p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 143, err
    assert time.monotonic() - t0 < 10.0  # graceful: nowhere near the 20 s grace
    for rank in (0, 1):
        assert marks(tmp_path, rank)[0] == "ready" and marks(tmp_path, rank)[-1] == "exit", marks(tmp_path, rank)
    assert "Traceback" not in err
    assert wait_gone(launch.token) == []


def test_passthrough_signal_reaches_workers_that_go_on(launch, tmp_path):
    p = signal_workers(launch, tmp_path, "--passthrough_signals", "SIGUSR1", SLEEP="2.5")
    p.send_signal(signal.SIGUSR1)
    wait_for(all_have(tmp_path, "SIGUSR1"), what="workers to get SIGUSR1", proc=p)
    assert p.poll() is None
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    for rank in (0, 1):
        assert marks(tmp_path, rank) == ["ready", "SIGUSR1", "done"], marks(tmp_path, rank)
    assert "passing SIGUSR1" in err


# ---------------------------------------------------------------------------- restarts


def test_restart_reinitialises_a_gloo_process_group(launch):
    r = launch.run("--nproc_per_node", "2", "--max_restarts", "1", worker("gloo_restart.py"), timeout=100)
    assert r.returncode == 0, r.stdout + r.stderr
    joined = re.findall(r"^\[rank(\d)\]: joined rank=\1 restart=(\d) port=(\d+)$", r.stdout, re.M)
    ports = {(int(rank), int(restart)): port for rank, restart, port in joined}
    assert set(ports) == {(0, 0), (1, 0), (0, 1), (1, 1)}, r.stdout
    assert ports[(0, 0)] == ports[(1, 0)] != ports[(0, 1)] == ports[(1, 1)]  # a fresh store each round
    reduced = re.findall(r"^\[rank(\d)\]: reduced rank=\1 restart=(\d) sum=(\S+)$", r.stdout, re.M)
    assert sorted(reduced) == [("0", "1", "3"), ("1", "1", "3")], r.stdout
    assert "exited with code 1; stopping the group" in r.stderr


def test_restart_budget_exhausted(launch):
    r = launch.run(
        "--nproc_per_node",
        "2",
        "--max_restarts",
        "2",
        worker("exit_code.py"),
        env={"FAIL_RANK": "0", "CODE": "1", "DELAY": "0.1"},
        timeout=60,
    )
    assert r.returncode != 0
    seen = re.findall(r"^\[rank0\]: out rank=0 restart=(\d)$", r.stdout, re.M)
    assert seen == ["0", "1", "2"], r.stdout
    assert "after 2 restart(s)" in r.stderr
    assert "no restarts left" in r.stderr
    root = next(l for l in r.stderr.splitlines() if "root cause:" in l)
    assert "rank 0" in root and "(attempt 2)" in root, root
    assert wait_gone(launch.token) == []


# ---------------------------------------------------------------------------- error files


def test_record_error_file_in_summary(launch):
    r = launch.run("--nproc_per_node", "1", worker("record_error.py"), timeout=60)
    assert r.returncode == 1, r.stderr
    summary = launcher_lines(r.stderr)
    assert "  error: ValueError: bad learning rate -1" in summary, r.stderr
    trace = summary[summary.index("  traceback:") + 1 :]
    assert any("record_error.py" in l and "in main" in l for l in trace), r.stderr
    assert any('raise ValueError("bad learning rate -1")' in l for l in trace), r.stderr
    assert any(l.startswith("  error file: ") and l.endswith("attempt_0/0/error.json") for l in summary)


# ---------------------------------------------------------------------------- logs


def test_log_dir_keeps_every_attempt(launch, tmp_path):
    r = launch.run(
        "--nproc_per_node",
        "2",
        "--max_restarts",
        "1",
        "--log_dir",
        str(tmp_path),
        worker("exit_code.py"),
        env={"FAIL_RANK": "1", "FAIL_ON": "0", "CODE": "4", "DELAY": "1", "SLEEP": "0.3"},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    run_dir = only_run_dir(tmp_path, "*")
    assert sorted(p.name for p in run_dir.iterdir()) == ["attempt_0", "attempt_1"]
    for attempt in (0, 1):
        for rank in (0, 1):
            folder = run_dir / f"attempt_{attempt}" / str(rank)
            assert (folder / "stdout.log").read_text() == f"out rank={rank} restart={attempt}\n"
            assert (folder / "stderr.log").read_text() == f"err rank={rank} restart={attempt}\n"
    assert "[rank1]: out rank=1 restart=0" in r.stdout and "[rank1]: out rank=1 restart=1" in r.stdout
    assert "[rank0]: err rank=0 restart=1" in r.stderr


def test_console_lines_are_prefixed(launch):
    r = launch.run("--nproc_per_node", "2", worker("exit_code.py"), env={"SLEEP": "0"}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["[rank0]: out rank=0 restart=0", "[rank1]: out rank=1 restart=0"]
    assert sorted(worker_lines(r.stderr)) == ["[rank0]: err rank=0 restart=0", "[rank1]: err rank=1 restart=0"]


def test_redirects_3_sends_output_to_files_only(launch, tmp_path):
    r = launch.run(
        "--nproc_per_node",
        "2",
        "--redirects",
        "3",
        worker("exit_code.py"),
        env={"SLEEP": "0", "TMPDIR": str(tmp_path)},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and worker_lines(r.stderr) == [], r.stdout + r.stderr
    run_dir = only_run_dir(tmp_path, "launcher-*")
    for rank in (0, 1):
        folder = run_dir / "attempt_0" / str(rank)
        assert (folder / "stdout.log").read_text() == f"out rank={rank} restart=0\n"
        assert (folder / "stderr.log").read_text() == f"err rank={rank} restart=0\n"


def test_tee_1_sends_stdout_to_console_and_file(launch, tmp_path):
    r = launch.run(
        "--nproc_per_node",
        "2",
        "--tee",
        "1",
        worker("exit_code.py"),
        env={"SLEEP": "0", "TMPDIR": str(tmp_path)},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["[rank0]: out rank=0 restart=0", "[rank1]: out rank=1 restart=0"]
    assert len(worker_lines(r.stderr)) == 2  # stderr is not teed: console only
    run_dir = only_run_dir(tmp_path, "launcher-*")
    for rank in (0, 1):
        folder = run_dir / "attempt_0" / str(rank)
        assert (folder / "stdout.log").read_text() == f"out rank={rank} restart=0\n"
        assert not (folder / "stderr.log").exists()


def test_local_ranks_filter_hides_from_console_not_from_files(launch, tmp_path):
    r = launch.run(
        "--nproc_per_node",
        "2",
        "--local_ranks_filter",
        "0",
        worker("exit_code.py"),
        env={"SLEEP": "0", "TMPDIR": str(tmp_path)},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[rank0]: out rank=0 restart=0"]
    assert worker_lines(r.stderr) == ["[rank0]: err rank=0 restart=0"]
    folder = only_run_dir(tmp_path, "launcher-*") / "attempt_0" / "1"
    assert (folder / "stdout.log").read_text() == "out rank=1 restart=0\n"
    assert (folder / "stderr.log").read_text() == "err rank=1 restart=0\n"


def test_console_gets_whole_lines_only(launch):
    lines, width = 200, 5000
    r = launch.run(
        "--nproc_per_node", "2", worker("many_lines.py"), env={"LINES": str(lines), "WIDTH": str(width)}, timeout=60
    )
    assert r.returncode == 0, r.stderr[-2000:]
    seen = {0: [], 1: []}
    for line in r.stdout.splitlines():
        m = re.fullmatch(r"\[rank(\d)\]: (\d):(\d+):([a-z]+)", line)
        assert m, line[:120]
        rank = int(m.group(1))
        assert int(m.group(2)) == rank and m.group(4) == "ab"[rank] * width, line[:120]
        seen[rank].append(int(m.group(3)))
    assert seen == {0: list(range(lines)), 1: list(range(lines))}
