"""Quarantine and the policy stop across nodes, on c10d and etcd: real agents on one host (so a
quarantined host is this host: a node started after the quarantine is refused), a store that
outlives the nodes (a standalone `launcher store`, or etcd), `launcher status` reading it back."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess

import pytest
from support.etcd import job_flags
from support.launcher_runs import c10d
from support.paths import LAUNCHER, ROOT, worker
from support.ports import free_port


def status(where: list[str], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*LAUNCHER, "status", *where, "--rdzv_id", "quarantine", *extra],
        capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_a_node_failing_its_health_check_is_quarantined_named_and_refused_again(cluster, backend, request):
    if backend == "c10d":  # a standalone store: the records outlive the nodes
        port = free_port()
        cluster.store("127.0.0.1", port)
        flags = c10d(port, "1:2", run_id="quarantine", conf="is_host=false")
        where = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}"]
    else:
        endpoint = request.getfixturevalue("etcd").endpoint
        flags = job_flags(endpoint, "1:2", run_id="quarantine")
        where = ["--rdzv_backend", "etcd", "--rdzv_endpoint", endpoint]
    member = cluster.start(*flags, worker("exit_code.py"), env={"SLEEP": "60"})
    member.wait_for("out rank=0 restart=0", timeout=60)
    check = "echo 'GPU 1: fallen off the bus'; exit 1"
    sick = cluster.start(*flags, "--health_check", check, worker("exit_code.py"))
    assert sick.wait(60) == 69, sick.stderr
    host = socket.gethostname()
    why = f"health check failed: --health_check {check!r} exited 1: GPU 1: fallen off the bus"
    assert f"{host} is quarantined: {why}; leaving the job (exit 69: drain this node)" in sick.stderr
    assert "out rank=" not in sick.stdout  # it never joined, so never ran a worker

    seen = json.loads(status(where, "--json").stdout)
    assert [(q["host"], q["why"], round(q["until"] - q["at"])) for q in seen["quarantined"]] == [(host, why, 3600)]
    assert f"quarantined: {host} ({why})" in " ".join(status(where).stdout.split())  # the caption wraps

    again = cluster.start(*flags, worker("exit_code.py"))  # the same host, healthy now, within the cooldown
    assert again.wait(60) == 69, again.stderr
    assert re.search(
        rf"{host} is quarantined: 3\d\d\d s of its cooldown left, for: {re.escape(why)}; leaving", again.stderr
    )
    assert member.popen.poll() is None  # the job goes on without them


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_a_deterministic_failure_ends_the_job_on_every_node_with_exit_70(cluster, backend, request):
    if backend == "c10d":
        flags = c10d(free_port(), "2", "--max_restarts", "5")
    else:
        flags = job_flags(request.getfixturevalue("etcd").endpoint, "2", "--max_restarts", "5", run_id="stop70")
    agents = [
        cluster.start(
            *flags, worker("raise_rank.py"),
            env={"FAIL_RANK": "1", "FAIL_AFTER": "0.2", "SLEEP": "60"},
        )
        for _ in range(2)
    ]  # fmt: skip
    assert [a.wait(90) for a in agents] == [70, 70], [a.stderr for a in agents]
    why = "rank 1 failed twice with the same error before any step: RuntimeError: loss is NaN at step 7 on rank 1"
    stopped = [a for a in agents if f"launcher: not restarting: {why} (exit 70: do not requeue)" in a.stderr]
    assert len(stopped) == 1, [a.stderr for a in agents]  # the node of rank 1 decides ...
    other = next(a for a in agents if a is not stopped[0])
    assert "job failed (exit code 70: do not requeue) after 1 restart(s)" in other.stderr  # ... the other follows
    assert f"the job was closed: not restarting: {why}" in other.stderr


@pytest.mark.timeout(120)
def test_a_node_whose_workers_fail_repeatedly_is_quarantined_and_the_job_goes_on(cluster):
    port = free_port()
    flags = c10d(port, "1:2", "--max_restarts", "9", "--quarantine", "after=2,window=3", run_id="repeat")
    healthy = cluster.start(*flags, worker("policy_worker.py"), env={"SLURMD_NODENAME": "nodeA", "HEALTHY": "4"})
    healthy.wait_for("healthy", timeout=60)
    failing = cluster.start(*flags, worker("policy_worker.py"), env={"SLURMD_NODENAME": "nodeB"})
    assert failing.wait(90) == 69, failing.stderr
    why = "its workers failed in 2 of its last 2 rounds (--quarantine after=2,window=3)"
    assert f"nodeB is quarantined: {why}; leaving the job (exit 69: drain this node)" in failing.stderr
    assert healthy.wait(90) == 0, healthy.stderr  # it re-formed alone and finished
    assert f"nodeB is quarantined: {why}" in healthy.stderr  # told why the other node left
