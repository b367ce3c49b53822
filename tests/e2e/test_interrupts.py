"""Interrupts: SIGINT sent by `timeout` lets the workers save; one signal delivered twice in quick
succession counts once; the live table after Ctrl-C says the round was stopped by SIGINT."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from support.launcher_runs import all_have, marks
from support.paths import LAUNCHER, worker
from support.processes import wait_for, wait_gone


def test_timeout_sigint_lets_the_workers_save(launch, tmp_path):
    """coreutils `timeout` signals the launcher, then its own process group: SIGINT twice, at once."""
    r = subprocess.run(
        [
            "timeout",
            "-s",
            "INT",
            "--preserve-status",
            "3",
            *LAUNCHER,
            "--nproc_per_node",
            "2",
            "--shutdown_timeout",
            "20",
            worker("signals.py"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=launch.env({"MARK_DIR": str(tmp_path), "EXIT_DELAY": "1"}),
    )
    assert r.returncode == 130, r.stderr
    assert "second SIGINT" not in r.stderr, r.stderr
    for rank in (0, 1):
        assert marks(tmp_path, rank) == ["ready", "SIGINT", "exit"], marks(tmp_path, rank)  # saved, then left
    assert wait_gone(launch.token) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_same_signal_twice_in_quick_succession_counts_once(launch, tmp_path, sig):
    p = launch.start(
        "--nproc_per_node",
        "2",
        "--shutdown_timeout",
        "20",
        worker("signals.py"),
        env={"MARK_DIR": str(tmp_path), "EXIT_DELAY": "1"},
    )
    wait_for(all_have(tmp_path, "ready"), what="workers ready", proc=p)
    p.send_signal(sig)
    time.sleep(0.05)  # the stimulus (not a wait): the second delivery 50 ms after the first, one burst
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 128 + sig, err
    assert "second" not in err and err.count(f"got {sig.name}") == 1, err
    for rank in (0, 1):
        assert marks(tmp_path, rank) == ["ready", sig.name, "exit"], marks(tmp_path, rank)
    assert wait_gone(launch.token) == []


def test_live_table_after_ctrl_c_says_stopped_by_sigint(launch, tmp_path):
    p = launch.start(
        "--live", "--nproc_per_node", "2", worker("signals.py"), env={"MARK_DIR": str(tmp_path), "COLUMNS": "150"}
    )
    wait_for(all_have(tmp_path, "ready"), what="workers ready", proc=p)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    final_table = err.split("got SIGINT")[-1]
    assert "round 0 · stopped by SIGINT" in final_table and "· failed ·" not in final_table, err
