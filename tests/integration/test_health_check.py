"""`--health_check CMD` as the gate runs it: a real /bin/sh, bounded in time, its whole tree killed
when it overruns; the reason is one line (the command's last output line)."""

from __future__ import annotations

import time

import psutil

from launcher.policy.health import HealthGate, run_command


def test_a_command_that_exits_0_passes():
    assert run_command("true", 5) == ""


def test_a_failing_command_is_named_with_its_last_line():
    command = "echo checking; echo 'nvidia-smi: GPU 3 fell off the bus' >&2; exit 4"
    assert run_command(command, 5) == f"--health_check {command!r} exited 4: nvidia-smi: GPU 3 fell off the bus"


def test_a_command_past_its_time_is_killed_with_its_children(tmp_path):
    pidfile = tmp_path / "child"
    started = time.monotonic()
    why = run_command(f"sleep 60 & echo $! > {pidfile}; wait", 0.5)
    assert why == f"--health_check 'sleep 60 & echo $! > {pidfile}; wait' did not finish within 0.5 s"
    assert time.monotonic() - started < 30  # bounded (generously: the machine is shared)
    child = int(pidfile.read_text())
    try:
        proc = psutil.Process(child)
        proc.wait(timeout=10)  # killed: gone (or a zombie about to be reaped by init)
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_command_not_found_is_named():
    assert run_command("/nonexistent-health-check", 5).startswith(
        "--health_check '/nonexistent-health-check' exited 127: "
    )


def test_the_gate_without_nvml_runs_only_the_command():
    assert HealthGate("true", nvml=lambda: None).check([1]) == ""
    assert HealthGate("false", nvml=lambda: None).check() == "--health_check 'false' exited 1"
