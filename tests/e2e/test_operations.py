"""Operations: sd_notify on a real datagram socket, the events file, GPU selection, the live view, systemd."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest
from support import system
from support.paths import ROOT, worker


def notified(launch, tmp_path, *args: str, **env: str) -> list[str]:
    """Run the launcher under a fake systemd (NOTIFY_SOCKET): every message it sent up to STOPPING=1."""
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(20)
    p = launch.start(*args, env={"NOTIFY_SOCKET": path, **env})
    messages = []
    while not any("STOPPING=1" in m for m in messages):
        messages.append(sock.recv(4096).decode())
    assert p.wait(20) == 0
    return messages


def test_sd_notify_ready_status_watchdog_stopping(launch, tmp_path):
    messages = notified(
        launch, tmp_path, "--nproc_per_node", "2", worker("dump_env.py"), WATCHDOG_USEC="100000", DUMP_DIR=str(tmp_path)
    )
    ready = next(m for m in messages if "READY=1" in m)
    assert "STATUS=round 0: 2 workers running" in ready
    assert messages.index(ready) < [i for i, m in enumerate(messages) if "STOPPING=1" in m][0]
    env = json.loads((tmp_path / "0.json").read_text())["env"]
    assert "NOTIFY_SOCKET" not in env and "WATCHDOG_USEC" not in env  # systemd talks to the agent alone


def test_watchdog_pings_while_running(launch, tmp_path):
    messages = notified(
        launch, tmp_path, "--nproc_per_node", "1", worker("node_info.py"), WATCHDOG_USEC="200000", SLEEP="1.2"
    )
    assert sum(m == "WATCHDOG=1" for m in messages) >= 5  # every 0.1 s for ~1.2 s


def test_events_file_records_the_story(launch, tmp_path):
    events_file = tmp_path / "events.jsonl"
    r = launch.run(
        "--nproc_per_node",
        "2",
        "--max_restarts",
        "1",
        "--events_file",
        str(events_file),
        worker("node_info.py"),
        env={"FAIL_RANK": "1", "SLEEP": "0.5"},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "rendezvous" and kinds[-1] == "finished"
    assert kinds.count("spawn") == 4 and kinds.count("running") == 2 and "stopping" in kinds
    failed = [e for e in events if e["event"] == "exit" and e["returncode"] == 5]
    assert failed and failed[0]["rank"] == 1 and not failed[0]["collateral"]
    assert all(isinstance(e["time"], float) for e in events)
    assert events[-1]["exit_code"] == 0 and events[-1]["restarts"] == 1


def test_gpus_select_devices(launch, tmp_path):
    r = launch.run("--gpus", "2,3", worker("dump_env.py"), env={"DUMP_DIR": str(tmp_path)}, timeout=60)
    assert r.returncode == 0, r.stderr
    envs = {p.stem: json.loads(p.read_text())["env"] for p in tmp_path.glob("*.json")}
    assert sorted(envs) == ["0", "1"]  # nproc defaults to the number of GPUs
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs.values()} == {"2,3"}
    assert {e["CUDA_DEVICE_ORDER"] for e in envs.values()} == {"PCI_BUS_ID"}


def test_gpus_with_virtual_local_rank(launch, tmp_path):
    r = launch.run(
        "--gpus", "5,7", "--virtual_local_rank", worker("dump_env.py"), env={"DUMP_DIR": str(tmp_path)}, timeout=60
    )
    assert r.returncode == 0, r.stderr
    envs = {p.stem: json.loads(p.read_text())["env"] for p in tmp_path.glob("*.json")}
    assert envs["0"]["CUDA_VISIBLE_DEVICES"] == "5" and envs["1"]["CUDA_VISIBLE_DEVICES"] == "7"
    assert envs["0"]["LOCAL_RANK"] == envs["1"]["LOCAL_RANK"] == "0"


def test_more_workers_than_gpus_is_an_error(launch):
    r = launch.run("--gpus", "0", "--nproc_per_node", "2", worker("echo_args.py"), timeout=30)
    assert r.returncode == 2 and "more workers than --gpus gives" in r.stderr


def test_quiet_and_timestamped_notes(launch):
    loud = launch.run(
        "--nproc_per_node",
        "1",
        "--max_restarts",
        "1",
        worker("node_info.py"),
        env={"FAIL_RANK": "0", "SLEEP": "0"},
        timeout=60,
    )
    note = next(l for l in loud.stderr.splitlines() if "stopping the group" in l)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d launcher: ", note)  # off a terminal: timestamped
    quiet = launch.run(
        "-q",
        "--nproc_per_node",
        "1",
        "--max_restarts",
        "1",
        worker("node_info.py"),
        env={"FAIL_RANK": "0", "SLEEP": "0"},
        timeout=60,
    )
    assert quiet.returncode == 0 and "launcher:" not in quiet.stderr


@pytest.mark.skipif(not system.which("tmux"), reason=system.missing("tmux", "tmux"))
def test_live_view_in_a_real_terminal(tmp_path):
    session = f"lv{uuid.uuid4().hex[:8]}"
    script = tmp_path / "chatty.py"
    script.write_text("import os, time\nfor i in range(40):\n    print('step', i, flush=True); time.sleep(0.1)\n")
    cmd = f"cd {ROOT} && {sys.executable} -m launcher --nproc_per_node 2 {script}; sleep 30"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "30", cmd], check=True, timeout=10)
    try:
        screen = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not re.search(r"│\s+0 │\s+\d+ │ running", screen):
            time.sleep(0.3)
            screen = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
            ).stdout
        assert "round 0 · running" in screen and "last line" in screen, screen
        assert re.search(r"│\s+0 │\s+\d+ │ running", screen), screen
        assert "[rank0]: step" in screen  # logs scroll above the table
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_unit_template_verifies(tmp_path):
    unit = tmp_path / "launcher@demo.service"
    unit.write_text((ROOT / "scripts" / "systemd" / "launcher@.service").read_text())
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    text = unit.read_text()
    assert "Type=notify" in text and "Restart=on-failure" in text and "RestartPreventExitStatus=2" in text
