"""A real 2-node c10d job whose agent hosts the store under a descriptor limit of 1,024, attacked the
whole time by hostile clients (issue 23's done-when): the job finishes, a worker killed mid-run
restarts, no node is declared dead, the host stays under AGENT_PEAK_RSS and a fresh client is
answered within FRESH_BOUND. Loopback only; the attacker is bounded in count and time."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.ports import free_port

from launcher.tcpstore import StoreClient, StoreError

pytestmark = pytest.mark.timeout(150)

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "workers" / "bootstrap_client.py"
ATTACKER = ROOT / "tests" / "integration" / "store_attacker.py"
FRESH_BOUND = 10.0
AGENT_PEAK_RSS = 640 << 20  # the agent (~60 MiB) with its store's budget of unread replies (256 MiB) and slack
ATTACKS = {"idle": 1100, "slow": 200, "trickle": 24, "big": 1, "nonread": 30}


def low_limit() -> None:
    os.setsid()
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def peak_rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    except (OSError, StopIteration):
        return 0


@pytest.fixture
def procs():
    made: list[subprocess.Popen] = []
    yield made
    for p in made:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_a_two_node_job_finishes_beside_every_attack_on_its_store(procs, tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLEEP": "12", "FAIL_RANK": "0", "FAIL_AFTER": "3"}
    env["PYTHONFAULTHANDLER"] = "1"  # a node that never ends is sent SIGABRT below: its stacks say where it waits
    for is_host in ("true", "false"):
        args = [
            "--nnodes", "2", "--nproc_per_node", "1", "--max_restarts", "1", "--rdzv_backend", "c10d",
            "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "hostile",
            "--rdzv_conf", f"is_host={is_host},last_call_timeout=1", str(WORKER),
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "launcher", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=tmp_path,
                preexec_fn=low_limit,
            )
        )
    host = procs[0]
    StoreClient("127.0.0.1", port, timeout=30, connect_timeout=30).close()  # the host's store listens
    attacker = subprocess.Popen(
        [sys.executable, str(ATTACKER), str(port), "25", *[f"--{k}={v}" for k, v in ATTACKS.items()]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    procs.append(attacker)
    outs: list[tuple[str, str]] = [("", "")] * 2
    readers = [threading.Thread(target=lambda i=i: outs.__setitem__(i, procs[i].communicate())) for i in range(2)]
    for t in readers:
        t.start()
    ends = time.monotonic() + 120
    fresh, errors, peak = [], [], 0
    while host.poll() is None or attacker.poll() is None:
        peak = max(peak, peak_rss(host.pid))
        if host.poll() is None:
            t = time.monotonic()
            try:
                c = StoreClient("127.0.0.1", port, timeout=FRESH_BOUND, connect_timeout=FRESH_BOUND)
                c.num_keys()
                c.close()
                fresh.append(time.monotonic() - t)
            except StoreError as e:
                try:  # the job may have finished, its store closing before its process exits
                    host.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    errors.append(str(e))
        time.sleep(1.0)
    for p in procs[:2]:
        try:
            p.wait(max(1.0, ends - time.monotonic()))
        except subprocess.TimeoutExpired:  # a node that never ends: its threads' stacks into its stderr
            os.kill(p.pid, signal.SIGABRT)
    for t in readers:
        t.join(30)
    counts = json.loads(attacker.communicate(timeout=30)[0].strip().splitlines()[-1])
    print(
        f"attacks {counts}; fresh clients answered in at most {max(fresh, default=0):.2f} s; "
        f"host peak RSS {peak >> 20} MiB"
    )
    codes = [p.returncode for p in procs[:2]]
    assert codes == [0, 0], [e[-12000:] for _, e in outs]
    for out, err in outs:
        assert re.findall(r"restart=(\d) bootstrapped", out) == ["0", "1"], out
        for bad in ("stopped heartbeating", "died", "lost the rendezvous store", "gave up reconnecting"):
            assert bad not in err, err[-3000:]
    assert not errors, errors
    assert fresh, "no fresh client was tried while the job ran"
    assert counts["closed_by_server"] + counts["refused"] > 0, counts
    assert peak < AGENT_PEAK_RSS, f"{peak >> 20} MiB"
