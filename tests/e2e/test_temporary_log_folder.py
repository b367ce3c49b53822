"""The temporary log folder: named when output is redirected without --log_dir or a run is
interrupted; none left by a quiet successful run."""

from __future__ import annotations

import os
import re
import signal

from support.launcher_runs import all_have
from support.paths import worker
from support.processes import wait_for


def temp_folders(text: str) -> set[str]:
    return set(re.findall(r"(/\S*/launcher-[\w.-]+)", text))


def test_redirects_without_log_dir_names_the_temporary_folder(launch, tmp_path):
    r = launch.run(
        "--nproc_per_node",
        "2",
        "--redirects",
        "3",
        worker("exit_code.py"),
        env={"FAIL_RANK": "1", "SLEEP": "5", "TMPDIR": str(tmp_path)},
    )
    assert r.returncode == 3, r.stderr
    lines = r.stderr.splitlines()
    [folder] = temp_folders(r.stderr)
    assert folder.startswith(str(tmp_path)) and os.path.isdir(folder)
    assert "logs in" in lines[0] and folder in lines[0], lines  # named once at the start
    assert any("kept in" in line and folder in line for line in lines[1:]), lines  # and in the summary
    assert open(os.path.join(folder, "attempt_0", "1", "stdout.log")).read() == "out rank=1 restart=0\n"


def test_an_interrupted_run_names_the_folder_it_keeps(launch, tmp_path):
    marks_dir = tmp_path / "marks"
    marks_dir.mkdir()
    p = launch.start(
        "--nproc_per_node",
        "2",
        "--redirects",
        "3",
        worker("signals.py"),
        env={"MARK_DIR": str(marks_dir), "TMPDIR": str(tmp_path)},
    )
    wait_for(all_have(marks_dir, "ready"), what="workers ready", proc=p)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    [folder] = temp_folders(err)
    summary = err.split("got SIGINT")[1]
    assert f"kept in {folder}" in summary and "stopped by SIGINT" in summary, err


def test_a_quiet_successful_run_without_files_leaves_no_folder(launch, tmp_path):
    r = launch.run("--nproc_per_node", "2", worker("echo_args.py"), env={"TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert temp_folders(r.stderr) == set() and list(tmp_path.iterdir()) == []
