"""A newcomer's rough edges (issue 25), on the real launcher: a missing dependency, a typo, Ctrl-C
while the nodes meet, the events file with no restart left, the restart line's grammar, and torch's
traceback prefix on two nodes. Each test starts its own launchers and leaves nothing running."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ROOT / "tests" / "workers"


def user_env() -> dict[str, str]:
    """The environment a user's shell gives: none of the launcher's PET_* defaults from the test run. Read
    when a test runs: the session's TMPDIR (tests/conftest.py) is set after this module is imported."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_"))}


def run(*args: str, timeout: float = 60, env: dict | None = None, python: list[str] | None = None):
    return subprocess.run(
        [*(python or [sys.executable]), "-m", "launcher", *args],
        cwd=ROOT,
        env={**user_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_exit_2(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


def test_missing_psutil_and_torch_is_one_line_naming_the_fix():
    # the interpreter of a newcomer who ran `python3 -m launcher` without the venv: no psutil, no torch
    blocked = (
        "import sys; sys.modules['psutil'] = sys.modules['torch'] = None; "
        "from launcher.cli.commands import main; main()"
    )
    r = subprocess.run(
        [sys.executable, "-c", blocked, "--nproc_per_node", "1", str(WORKERS / "echo_args.py")],
        cwd=ROOT,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = one_line_exit_2(r)
    assert line.startswith(f"launcher: error: psutil and torch are not installed for {sys.executable}; "), line
    assert "source " in line or "pip install" in line or "setup.sh" in line, line


def test_launch_without_click_is_one_line_too():
    # `python -m launcher.launch` (torch.distributed.launch's spelling) with no site-packages: no traceback
    r = subprocess.run(
        [sys.executable, "-S", "-m", "launcher.launch", "--nproc_per_node", "1", str(WORKERS / "echo_args.py")],
        cwd=ROOT,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert one_line_exit_2(r).startswith("launcher.launch: error: click, psutil, rich and torch are not installed")


def test_an_interpreter_without_click_is_one_line_naming_every_missing_dependency():
    r = run("--nproc_per_node", "1", str(WORKERS / "echo_args.py"), python=[sys.executable, "-S"])  # no site-packages
    # all at once (issue 34): naming only click sent the user back for psutil, then rich, then torch
    assert one_line_exit_2(r).startswith("launcher: error: click, psutil, rich and torch are not installed for "), (
        r.stderr
    )


def test_a_script_that_always_fails_ends_with_the_policys_code_once_restarts_were_allowed():
    """README's exit codes: the worker's own 3 with --max_restarts 0; 75 (requeue) once its restart is spent."""
    env = {"FAIL_RANK": "0", "DELAY": "0", "CODE": "3"}
    assert run("--nproc_per_node", "1", str(WORKERS / "exit_code.py"), env=env).returncode == 3
    r = run("--nproc_per_node", "1", "--max_restarts", "1", str(WORKERS / "exit_code.py"), env=env)
    assert r.returncode == 75 and "exit code 75: requeue" in r.stderr, r.stderr


def test_a_transposed_option_suggests_the_option_meant():
    r = run("--nproc_pre_node", "2", str(WORKERS / "echo_args.py"))
    line = one_line_exit_2(r)
    assert "Did you mean --nproc_per_node?" in line, line


def test_with_no_restart_left_the_stop_is_not_called_a_restart(tmp_path):
    events = tmp_path / "events.jsonl"
    r = run(
        "--nproc_per_node",
        "1",
        "--max_restarts",
        "0",
        "--events_file",
        str(events),
        str(WORKERS / "exit_code.py"),
        env={"FAIL_RANK": "0", "DELAY": "0", "CODE": "3"},
    )
    assert r.returncode == 3, r.stderr
    seen = [json.loads(line) for line in events.read_text().splitlines()]
    stops = [e for e in seen if e["event"] == "stopping"]
    assert [e["reason"] for e in stops] == ["fail"], stops
    assert seen[-1]["event"] == "finished" and seen[-1]["state"] == "failed", seen[-1]


def test_a_restart_of_one_worker_says_one_worker(tmp_path):
    events = tmp_path / "events.jsonl"
    r = run(
        "--nproc_per_node",
        "1",
        "--max_restarts",
        "1",
        "--events_file",
        str(events),
        str(WORKERS / "exit_code.py"),
        env={"FAIL_RANK": "0", "FAIL_ON": "0", "DELAY": "0", "SLEEP": "0"},
    )
    assert r.returncode == 0, r.stderr
    assert "starting 1 worker, world size 1" in r.stderr and "1 workers" not in r.stderr, r.stderr
    assert [json.loads(line)["reason"] for line in events.read_text().splitlines() if '"stopping"' in line] == [
        "restart"
    ]


def interrupted(port: int, *flags: str) -> subprocess.CompletedProcess:
    """A 2-node c10d launcher still meeting the other node, interrupted with SIGINT (Ctrl-C) once it
    said it waits (the pytest timeout bounds a launcher that would never say so)."""
    p = subprocess.Popen(
        [sys.executable, "-m", "launcher", "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d"]
        + ["--rdzv_endpoint", f"127.0.0.1:{port}", *flags, str(WORKERS / "echo_args.py")],
        cwd=ROOT,
        env={**user_env(), "LAUNCHER_LOG_LEVEL": "debug"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # a client: the debug line of its first failed connect; the host: its first waiting line (5 s)
        want = "store" if "is_host=false" in flags else "waiting for nodes"
        line = p.stderr.readline()
        while line and want not in line:
            line = p.stderr.readline()
        assert want in line, line
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_ctrl_c_while_connecting_to_the_store_says_what_was_stopped():
    r = interrupted(free_port(), "--rdzv_conf", "is_host=false")
    assert r.returncode == 130, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "got SIGINT while connecting to the c10d rendezvous; stopped (no worker was started)" in last, r.stderr
    assert not r.stderr.endswith("\n\n") and "Traceback" not in r.stderr, r.stderr


def test_ctrl_c_while_waiting_for_the_other_node_says_what_was_stopped():
    r = interrupted(free_port())
    assert r.returncode == 130, r.stderr
    assert "got SIGINT while waiting for the rendezvous to form a round; stopped (no worker was running)" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr


RAISES_AFTER_INIT = """
import os, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise RuntimeError("boom on rank 1")
dist.barrier()
"""


@pytest.mark.timeout(180)
def test_two_nodes_on_one_host_say_the_rank_once_on_torchs_traceback(tmp_path):
    script = tmp_path / "raises.py"
    script.write_text(RAISES_AFTER_INIT)
    port = free_port()
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "launcher", "--nnodes", "2", "--node_rank", str(n), "--nproc_per_node", "1"]
            + ["--master_addr", "127.0.0.1", "--master_port", str(port), "--no-live", str(script)],
            cwd=ROOT,
            env=user_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=150) for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.wait()
    host = socket.gethostname()
    text = outs[1][1]
    assert nodes[1].returncode == 1, text
    assert f"[{host} rank1]: Traceback (most recent call last):" in text, text
    assert f"[{host} rank1]: RuntimeError: boom on rank 1" in text, text
    assert "]: [rank1]:" not in text, text


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_demo_loses_a_worker_resumes_and_a_second_run_trains_again():
    made = []
    try:
        for _ in range(2):
            r = subprocess.run(
                ["bash", str(ROOT / "scripts" / "demo.sh"), "--epochs", "3"],
                cwd=ROOT,
                env=user_env(),
                capture_output=True,
                text=True,
                timeout=110,
            )
            folder = re.search(r"checkpoints in (\S+)/", r.stderr)
            made += [ROOT / folder.group(1)] if folder else []
            assert r.returncode == 0, r.stdout + r.stderr
            assert "rank 1 killed by SIGKILL; stopping the group" in r.stderr, r.stderr
            assert re.search(
                r"resumed at step \d+ \(epoch 3\) from the launcher's copy in memory, not a checkpoint; "
                r"training again [\d.]+ s after rank 1 was killed",
                r.stdout,
            )
            assert "epoch 3/3" in r.stdout and "job succeeded after 1 restart(s)" in r.stderr, r.stdout + r.stderr
            assert "WARNING" not in r.stderr and "nothing to do" not in r.stdout, r.stderr
        assert len(set(made)) == 2  # each run trains in a folder of its own
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
