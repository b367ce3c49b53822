"""Spares on etcd (issue 22): the scenarios of test_spares_c10d.py on a real etcd (started here on free
loopback ports), where every agent is a client and a dead agent is told by its lease (2 s). Losing the
node with group rank 0 (the workers' bootstrap store) is survivable here as on `launcher store`."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support import system
from test_spares_c10d import (
    ROOT,
    STEPS,
    Job,
    free_port,
    member_lost_spare_takes_over,
    node_lost_while_round_forms,
    replacement_past_bound,
    replacement_within_bound,
    spare_of_a_failed_job,
    spares_share_the_verdict,
)

ETCD = system.which("etcd")
pytestmark = pytest.mark.skipif(ETCD is None, reason=system.missing("etcd", "etcd-server"))


@pytest.fixture
def etcd(tmp_path):
    """One etcd member on loopback (quick elections), its data in tmp_path; killed at teardown."""
    client, peer = free_port(), free_port()
    log = open(tmp_path / "etcd.log", "ab")
    proc = subprocess.Popen(
        [ETCD, "--name", "m0", "--data-dir", str(tmp_path / "etcd-data")]
        + [
            "--listen-client-urls",
            f"http://127.0.0.1:{client}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{client}",
        ]
        + [
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
        ]
        + [
            "--initial-cluster",
            f"m0=http://127.0.0.1:{peer}",
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
        ]
        + ["--log-level", "warn", "--logger", "zap"],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + 20
    while True:
        assert proc.poll() is None, (tmp_path / "etcd.log").read_text()[-2000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1) as r:
                if json.loads(r.read()).get("health") == "true":
                    break
        except (OSError, ValueError):
            pass
        assert time.monotonic() < deadline, "etcd not healthy within 20 s"
        time.sleep(0.05)
    yield f"127.0.0.1:{client}"
    proc.kill()
    proc.wait(10)


class EtcdJob(Job):
    def __init__(self, tmp: Path, endpoint: str, **kw):
        self.endpoint = endpoint
        super().__init__(tmp, ["--rdzv_backend", "etcd", "--rdzv_endpoint", endpoint], **kw)

    def alive_keys(self, r: int, tickets: int) -> int:
        """Counted through etcd's JSON gateway (one range request per key)."""
        found = 0
        for k in range(1, tickets + 1):
            key = base64.b64encode(f"/launcher/spares/r{r}/alive{k}".encode()).decode()
            req = urllib.request.Request(
                f"http://{self.endpoint}/v3/kv/range", json.dumps({"key": key, "count_only": True}).encode()
            )
            with urllib.request.urlopen(req, timeout=5) as resp:
                found += int(json.loads(resp.read()).get("count", 0))
        return found

    def status(self) -> dict:
        r = subprocess.run(
            [sys.executable, "-m", "launcher", "status", "--rdzv_backend", "etcd"]
            + ["--rdzv_endpoint", self.endpoint, "--rdzv_id", "spares", "--json"],
            capture_output=True,
            text=True,
            timeout=30,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)


@pytest.fixture
def job(tmp_path, etcd):
    j = EtcdJob(tmp_path, etcd)
    yield j
    j.cleanup()


@pytest.mark.timeout(180)
def test_member_sigkilled_spare_takes_its_group_rank(job):
    member_lost_spare_takes_over(job, signal.SIGKILL, lose_group=1)


@pytest.mark.timeout(180)
def test_member_sigtermed_spare_takes_its_group_rank(job):
    member_lost_spare_takes_over(job, signal.SIGTERM, lose_group=1)


@pytest.mark.timeout(180)
def test_group_rank_0_lost_a_spare_takes_it(job):
    member_lost_spare_takes_over(job, signal.SIGKILL, lose_group=0)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_node_lost_while_the_round_forms_never_enters_it(tmp_path, etcd, sig):
    j = EtcdJob(tmp_path, etcd, nnodes="3")
    try:
        node_lost_while_round_forms(j, sig)
    finally:
        j.cleanup()


@pytest.mark.timeout(180)
def test_no_spare_a_replacement_within_the_bound_is_admitted(job):
    replacement_within_bound(job)


@pytest.mark.timeout(180)
def test_no_spare_past_the_bound_the_reason_is_named(job):
    replacement_past_bound(job)


@pytest.mark.timeout(180)
def test_spares_are_listed_judged_and_exit_with_the_jobs_success(job):
    spares_share_the_verdict(job, job.status)


@pytest.mark.timeout(180)
def test_a_spare_of_a_failed_job_exits_with_its_verdict(tmp_path, etcd):
    j = EtcdJob(tmp_path, etcd, max_restarts=0, env={"FAIL_AT": f"0:{STEPS}"})
    try:
        spare_of_a_failed_job(j)
    finally:
        j.cleanup()
