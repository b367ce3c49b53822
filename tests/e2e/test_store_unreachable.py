"""A c10d store that cannot be reached is said within seconds, not after join_timeout (issue 25 item 1):
one line naming the endpoint, the error and how long the agent keeps trying, repeated calmly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.ports import free_port

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "workers" / "node_info.py"
SAID_WITHIN = 15.0  # TELL_AFTER (0.5 s) plus an interpreter's start on a loaded machine


class Agent:
    """`python -m launcher ARGS` in its own session, stderr read by a thread; killed at the end if it must be."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "launcher", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            start_new_session=True,
        )
        self.err: list[str] = []
        self.reader = threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True)
        self.reader.start()

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, "".join(self.err))
            if m:
                return m
            if self.proc.poll() is not None:
                self.reader.join(5)
                break
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} within {timeout} s; stderr:\n{''.join(self.err)[-3000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()


@pytest.fixture
def agents():
    made: list[Agent] = []
    yield lambda *args: made.append(Agent(*args)) or made[-1]
    for a in made:
        a.stop()


def c10d(endpoint: str, nnodes: str, conf: str = "") -> list[str]:
    return [
        "--nnodes", nnodes, "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
        "--rdzv_id", "unreachable", "--rdzv_conf", ",".join(filter(None, ["join_timeout=600", conf])),
        str(WORKER),
    ]  # fmt: skip


def test_a_typo_in_the_endpoint_is_said_within_seconds(agents):
    a = agents(*c10d("nosuchhost.invalid:29400", "2"))
    m = a.wait_for(
        r"cannot reach the store at nosuchhost\.invalid:29400 yet \((.+)\); retrying for up to (\d+) s", SAID_WITHIN
    )
    assert 550 <= int(m.group(2)) <= 600, m.group(0)
    assert m.group(1).strip()  # the resolver's error, whatever its words


def test_a_node_started_before_its_store_says_so_then_joins_once_it_listens(agents):
    port = free_port()
    a = agents(*c10d(f"127.0.0.1:{port}", "1", "is_host=false"))
    a.wait_for(
        rf"cannot reach the store at 127\.0\.0\.1:{port} yet \(Connection refused\); retrying for up to \d+ s",
        SAID_WITHIN,
    )
    store = agents("store", "--host", "127.0.0.1", "--port", str(port))
    try:
        assert a.proc.wait(60) == 0, "".join(a.err)[-3000:]
    finally:
        store.stop()
