"""The restart policy, the health gate and the policy exit codes with the real launcher on one node:
real workers (tests/workers/policy_worker.py) that fail as told, the events file read back."""

from __future__ import annotations

import json
import signal

import psutil
from support.paths import worker
from support.processes import procs_with_token, wait_for, wait_gone

FAST = ["--standalone", "--nproc_per_node", "1", "--monitor_interval", "0.05"]


def events(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_same_error_twice_stops_with_exit_70_and_no_more_restarts(launch, tmp_path):
    mark = tmp_path / "attempts"
    r = launch.run(
        *FAST, "--max_restarts", "5", worker("policy_worker.py"),
        env={"ERROR": "loss is NaN", "REACH": "7", "MARK": str(mark)}, timeout=90,
    )  # fmt: skip
    assert r.returncode == 70, r.stderr
    assert mark.read_text().split("\n")[:-1] == ["attempt 0", "attempt 1"]
    why = "rank 0 failed twice with the same error at step 7: RuntimeError: loss is NaN"
    assert r.stderr.count(f"not restarting: {why}") == 2, r.stderr  # the line, then the summary's reason
    assert "job failed (exit code 70: do not requeue) after 1 restart(s)" in r.stderr
    assert wait_gone(launch.token) == []


def test_varied_failures_that_spend_the_budget_exit_75(launch):
    r = launch.run(*FAST, "--max_restarts", "1", worker("policy_worker.py"), timeout=90)
    assert r.returncode == 75, r.stderr
    assert "job failed (exit code 75: requeue) after 1 restart(s)" in r.stderr


def test_without_a_restart_budget_the_workers_code_passes_through(launch):
    r = launch.run(*FAST, worker("exit_code.py"), env={"FAIL_RANK": "0", "CODE": "75", "SLEEP": "0"}, timeout=60)
    assert r.returncode == 1, r.stderr  # 75 is the launcher's "requeue": a worker's 75 is not passed as one


def test_restarts_that_never_pass_the_best_step_stop_with_exit_70(launch, tmp_path):
    log = tmp_path / "events.jsonl"
    r = launch.run(
        *FAST, "--max_restarts", "9", "--restart_policy", "no_progress=2,quick=0", "--events_file", str(log),
        worker("policy_worker.py"), env={"REACH": "10,5,6,99"}, timeout=90,
    )  # fmt: skip
    assert r.returncode == 70, r.stderr
    assert "not restarting: 2 restarts in a row made no progress past step 10" in r.stderr
    stops = [e for e in events(log) if e["event"] == "policy_stop"]
    assert [(e["stop"], e["host"] != "") for e in stops] == [("no_progress", True)]
    assert events(log)[-1]["exit_code"] == 70


def test_quick_failures_back_off_the_first_restart_immediate(launch, tmp_path):
    log = tmp_path / "events.jsonl"
    r = launch.run(
        *FAST, "--max_restarts", "3", "--restart_policy", "backoff=0.3,backoff_max=0.5", "--quarantine", "window=0",
        "--events_file", str(log), worker("policy_worker.py"), env={"OK_ON": "3"}, timeout=90,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    backoffs = [(e["delay"], e["quick_failures"]) for e in events(log) if e["event"] == "backoff"]
    assert backoffs == [(0.3, 2), (0.5, 3)]  # none before the first restart; doubled, then capped
    assert "restarting in 0.3 s: 2 quick failures in a row" in r.stderr


def test_a_failing_health_check_keeps_the_node_out_with_exit_69(launch, tmp_path):
    mark, noted = tmp_path / "attempts", tmp_path / "quarantined"
    check = "echo checking; echo 'GPU 3: fallen off the bus'; exit 1"
    env = {"MARK": str(mark), "LAUNCHER_QUARANTINE_FILE": str(noted), "SLURMD_NODENAME": "node7"}
    r = launch.run(*FAST, "--health_check", check, worker("policy_worker.py"), env=env, timeout=60)
    assert r.returncode == 69, r.stderr
    assert not mark.exists()  # no worker ever started
    assert noted.read_text() == "node7\n"  # for the Slurm scripts: exclude it when requeueing
    line = f"is quarantined: health check failed: --health_check {check!r} exited 1: GPU 3: fallen off the bus"
    assert r.stderr.count(line) == 2, r.stderr  # said once, and the summary's reason
    assert "job failed (exit code 69: quarantined: drain this node)" in r.stderr


def test_the_health_check_runs_before_each_round(launch, tmp_path):
    checks = tmp_path / "checks"
    r = launch.run(
        *FAST, "--max_restarts", "1", "--health-check", f"echo ok >> {checks}", worker("policy_worker.py"),
        env={"OK_ON": "1"}, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert checks.read_text() == "ok\nok\n"  # before the first round and before the restart


def test_the_health_check_is_also_read_from_pet_health_check(launch, tmp_path):
    r = launch.run(*FAST, worker("policy_worker.py"), env={"PET_HEALTH_CHECK": "exit 3"}, timeout=60)
    assert r.returncode == 69, r.stderr


def test_bad_policy_flags_are_one_line_and_exit_2(launch):
    r = launch.run(*FAST, "--restart_policy", "backof=1", worker("policy_worker.py"), timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--restart_policy key 'backof' is unknown" in r.stderr


def test_a_signal_during_a_long_health_check_leaves_nothing_behind(launch):
    p = launch.start(*FAST, "--health_check", "sleep 60", "--health_check_timeout", "120", worker("policy_worker.py"))

    def checking() -> bool:
        for pid in procs_with_token(launch.token):
            try:
                if psutil.Process(pid).cmdline()[:1] in (["sleep"], ["/bin/sh"]):
                    return True
            except psutil.Error:  # gone meanwhile
                pass
        return False

    wait_for(checking, what="the health check running", proc=p)
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 143, p.stderr.read()
    assert wait_gone(launch.token) == []  # the check was killed with its agent


def test_the_same_error_from_whichever_rank_fails_first_stops_with_exit_70(launch):
    # rank 0 fails first on attempt 0, rank 1 on attempt 1: the same failure (the same stderr line, the
    # same code), whatever rank it came from and whatever each printed on stdout after it
    r = launch.run(
        "--standalone", "--nproc_per_node", "2", "--monitor_interval", "0.05", "--max_restarts", "3",
        worker("same_error.py"), timeout=90,
    )  # fmt: skip
    assert r.returncode == 70, r.stderr
    why = "ranks 0 and 1 failed with the same error before any step: ValueError: the batch has no labels"
    assert f"not restarting: {why}" in r.stderr, r.stderr
    assert "after 1 restart(s)" in r.stderr
