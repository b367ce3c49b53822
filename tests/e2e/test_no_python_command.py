"""--no_python: a missing, unexecutable or vanished command is one clear line; a command is found
on the workers' PATH."""

from __future__ import annotations

import os

from support.launcher_runs import assert_one_line_exit_2
from support.processes import wait_gone


def test_no_python_missing_command_is_one_line(launch, tmp_path):
    r = launch.run("--nproc_per_node", "2", "--no_python", "nosuchcmd-launcher-test", env={"MARK_DIR": str(tmp_path)})
    assert_one_line_exit_2(r)
    assert "nosuchcmd-launcher-test" in r.stderr and "PATH" in r.stderr


def test_no_python_file_not_executable_is_one_line(launch, tmp_path):
    script = tmp_path / "run.sh"
    script.write_text('#!/bin/sh\ntouch "$MARK_DIR/ran"\n')
    r = launch.run("--no_python", str(script), env={"MARK_DIR": str(tmp_path)})
    assert_one_line_exit_2(r)
    assert "not executable" in r.stderr and "chmod +x" in r.stderr
    assert not (tmp_path / "ran").exists()


def test_no_python_command_found_on_the_worker_path(launch, tmp_path):
    script = tmp_path / "mycmd"
    script.write_text("#!/bin/sh\necho ran-$RANK\n")
    script.chmod(0o755)
    r = launch.run("--no_python", "mycmd", env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    assert "ran-0" in r.stdout


def test_no_python_command_that_vanishes_between_rounds_is_a_clear_failure(launch, tmp_path):
    script = tmp_path / "once.sh"
    script.write_text('#!/bin/sh\nrm -f "$0"\nexit 3\n')  # the first attempt removes the command
    script.chmod(0o755)
    r = launch.run("--max_restarts", "2", "--no_python", str(script), timeout=60)
    assert r.returncode == 3, r.stderr  # the first attempt's root cause, as for any failed job
    assert "Traceback" not in r.stderr, r.stderr
    assert f"reason: cannot start {script}" in r.stderr, r.stderr
    assert wait_gone(launch.token) == []
