"""The failure summary as plain lines, from hand-built results."""

from __future__ import annotations

import json

from launcher.spec import Exit, Failure, GroupState, RunResult, Worker
from launcher.telemetry.summary import read_error_file, summary_lines


def failure(rank: int, code: int, at: float, round: int = 0, collateral: bool = False, **more) -> Failure:
    return Failure(
        worker=Worker(local_rank=rank, rank=rank, local_world_size=4, world_size=4),
        pid=100 + rank,
        exit=Exit(code),
        at=at,
        host="h",
        round=round,
        collateral=collateral,
        **more,
    )


def result(*failures: Failure, code: int = 1, restarts: int = 0, message: str = "") -> RunResult:
    return RunResult(GroupState.FAILED, code, failures, restarts, None, message)


def test_nothing_to_say_on_success_or_without_a_cause():
    assert summary_lines(RunResult(GroupState.SUCCEEDED, 0, (failure(0, 1, 1.0),))) == []
    assert summary_lines(result(failure(0, -15, 1.0, collateral=True), code=143)) == []


def test_the_root_cause_with_its_error_file_traceback_and_logs(tmp_path):
    error_file = tmp_path / "error.json"
    error_file.write_text(
        json.dumps(
            {"message": {"message": "ValueError: bad batch", "extraInfo": {"py_callstack": "Traceback:\n  line 1\n"}}}
        )
    )
    root = failure(2, 3, 5.0, round=1, error_file=str(error_file), log_files=("/x/stdout.log", "/x/stderr.log"))
    lines = summary_lines(
        result(
            failure(0, 1, 1.0, round=0),
            root,
            failure(1, -15, 6.0, round=1, collateral=True),
            failure(3, -9, 6.5, round=1, collateral=True),
            code=3,
            restarts=1,
        )
    )
    assert lines == [
        "job failed (exit code 3) after 1 restart(s)",
        "root cause: rank 2 (local rank 2) on h, pid 102 exited with code 3 (attempt 1)",
        "  error: ValueError: bad batch",
        "  traceback:",
        "    Traceback:",
        "      line 1",
        "  log: /x/stdout.log",
        "  log: /x/stderr.log",
        f"  error file: {error_file}",
        "stopped by the launcher: rank 1 (pid 101), rank 3 (pid 103)",
    ]


def test_a_hang_reason_replaces_the_exit_and_others_that_failed_are_listed():
    hung = failure(1, -6, 2.0, reason="hung: no progress for 30 s; stacks in its stderr")
    lines = summary_lines(result(failure(0, 4, 3.0), hung, message="no restarts left (--max_restarts 0)"))
    assert lines == [
        "job failed (exit code 1) after 0 restart(s)",
        "reason: no restarts left (--max_restarts 0)",
        "root cause: rank 1 (local rank 1) on h, pid 101 hung: no progress for 30 s; stacks in its stderr (attempt 0)",
        "also failed: rank 0 (local rank 0) on h, pid 100 exited with code 4",
    ]


def test_error_files_torch_and_plain_and_broken(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"message": "just a string"}))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert read_error_file(str(plain)) == ("just a string", "")
    assert read_error_file(str(broken)) == ("", "")
    assert read_error_file(str(tmp_path / "missing.json")) == ("", "")
    assert read_error_file(None) == ("", "")


def test_a_signal_in_a_restarted_round_names_that_round_not_the_recovered_failure():
    """SIGTERM in round 1: round 0's kill was recovered by the restart; the stop is round 1's."""
    failures = (
        failure(1, -9, 1.0, round=0),
        failure(0, -15, 1.1, round=0, collateral=True),
        failure(0, -15, 9.0, round=1, collateral=True),
        failure(1, -15, 9.1, round=1, collateral=True),
    )
    stopped = RunResult(GroupState.FAILED, 143, failures, 1, 15, round=1)
    assert summary_lines(stopped) == [
        "job stopped by SIGTERM (exit code 143) after 1 restart(s)",
        "stopped by the launcher: rank 0 (pid 100), rank 1 (pid 101) (attempt 1)",
        "earlier, recovered by a restart: rank 1 (local rank 1) on h, pid 101 killed by SIGKILL (attempt 0)",
    ]
    unknown = RunResult(GroupState.FAILED, 143, failures[:2], 0, 15, round=0)  # stopped in the failure's own round
    assert summary_lines(unknown)[1].startswith("root cause: rank 1 (local rank 1) on h, pid 101 killed by SIGKILL")
