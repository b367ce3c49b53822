"""A job id run again on a long-lived `launcher store` (a Slurm requeue keeps its job id): once no node of
the last run is alive, the rerun starts clean (a new epoch of the job, `rendezvous.rerun`), whether that
run finished or failed; a late node of a job that still runs joins it and ends with its verdict.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from support.launcher_runs import LAUNCHER, ROOT, Cluster, c10d
from support.paths import worker
from support.ports import free_port

EXIT_CODE = worker("exit_code.py")


def run_job(cluster: Cluster, port: int, name: str, env: dict, rerun: bool = True) -> list[int]:
    """A 2-node job `rerun` (no restarts) on the store at `port`, to its end: the agents' exit codes. Every
    agent's worker ran (a rerun that only read the old run's end would exit 0 without one)."""
    args = c10d(port, "2", "--max_restarts", "0", run_id="rerun", conf="is_host=false")
    agents = [cluster.start(*args, EXIT_CODE, env=env, name=f"{name}{i}") for i in range(2)]
    codes = [a.wait(60) for a in agents]
    for a in agents:
        assert "waiting as a spare" not in a.stderr and "Traceback" not in a.stderr, a.stderr[-3000:]
        assert not rerun or "the job was closed: it" not in a.stderr and any("out rank=" in line for line in a.out), (
            a.stderr[-3000:]
        )
    return codes


def status(port: int) -> dict:
    done = subprocess.run(
        [*LAUNCHER, "status", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}"]
        + ["--rdzv_id", "rerun", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("first", ["finished", "failed"])
def test_a_job_id_rerun_on_a_long_lived_store_starts_clean(cluster, first):
    port = free_port()
    cluster.store("127.0.0.1", port)
    failing = {"FAIL_RANK": "0", "CODE": "3", "DELAY": "0.2", "SLEEP": "0.5"}
    codes = run_job(cluster, port, "first", failing if first == "failed" else {"SLEEP": "0.5"}, rerun=False)
    assert codes == ([3, 3] if first == "failed" else [0, 0]), codes  # the root cause's code, on every node
    assert status(port)["state"] == "closed"
    assert run_job(cluster, port, "again", {"SLEEP": "0.5"}) == [
        0,
        0,
    ]  # not "the job was closed", not spares of a round nobody is left to end
    job = status(port)
    assert (job["state"], job["round"]) == ("closed", 0) and job["closed"].startswith("it finished"), job
    assert run_job(cluster, port, "third", {"SLEEP": "0.5"}) == [0, 0]  # and again


@pytest.mark.parametrize("end", ["finished", "failed"])
def test_a_late_node_of_a_live_job_waits_and_ends_with_its_verdict(cluster, end):
    """The job's member is alive: the late node joins that job (as a spare of its full round), never a new
    one, and ends with the job's verdict."""
    port = free_port()
    cluster.store("127.0.0.1", port)
    args = c10d(port, "1", "--max_restarts", "0", run_id="rerun", conf="is_host=false")
    env = {"SLEEP": "6"} if end == "finished" else {"FAIL_RANK": "0", "CODE": "3", "DELAY": "6"}
    member = cluster.start(*args, EXIT_CODE, env=env, name="member")
    member.wait_for(r"out rank=0 restart=0", timeout=30)
    late = cluster.start(*args, EXIT_CODE, env=env, name="late")
    late.wait_for(r"waiting as a spare: round 0 is full", timeout=30, stream="err")
    rc = member.wait(60)
    assert rc == (0 if end == "finished" else 3), member.stderr[-3000:]
    assert late.wait(60) == rc, late.stderr[-3000:]
    assert "starts clean" not in late.stderr and "out rank=" not in "".join(late.out), late.stderr[-3000:]
    if end == "finished":
        assert "finished without this spare" in late.stderr, late.stderr[-3000:]
